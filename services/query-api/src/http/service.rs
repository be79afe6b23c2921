//! The public listener's service, [`Edge`]: every stage of [`super::edge`] and
//! [`super::middleware`] around the router, and the single-item route's fast path.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use futures::FutureExt;
use tower::ServiceExt;

use super::edge::Gate;
use super::middleware::RequestObserver;
use crate::state::AppState;

/// The public listener's service: every stage a request passes before and after the routes, in
/// one future around the whole router — the trace stage (`middleware::traced`: trace id, span,
/// timeline, metrics, error bodies, the slow-request log), the panic catcher, then the [`Gate`],
/// then the routes. Layers added with `Router::layer` wrap every route and, as `from_fn`, clone
/// and box the stack beneath them per request; this pays one box per request for all of it.
#[derive(Clone)]
pub struct Edge {
    routes: Router,
    shared: Arc<EdgeStages>,
}

struct EdgeStages {
    observer: Arc<RequestObserver>,
    gate: Gate,
    /// For the single-item route's fast path.
    state: AppState,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Edge")
            .field("gate", &self.shared.gate)
            .finish_non_exhaustive()
    }
}

impl Edge {
    pub fn new(routes: Router, state: AppState, gate: Gate) -> Self {
        Self {
            routes,
            shared: Arc::new(EdgeStages {
                observer: Arc::clone(&state.observer),
                gate,
                state,
            }),
        }
    }
}

impl tower::Service<Request> for Edge {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Edge { routes, shared } = self.clone();
        Box::pin(async move {
            let EdgeStages {
                observer,
                gate,
                state,
            } = &*shared;
            let response = super::middleware::traced(request, Some(observer), |request| {
                let stages = gate.run(request, |request| async move {
                    // The hot route straight to its handler: the router's matching, parameter
                    // maps and extractors cost more than the handler itself.
                    let request = match super::items::item_rebate_direct(state, request).await {
                        Ok(response) => return response,
                        Err(other) => other,
                    };
                    match routes.oneshot(request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                });
                // A panic below becomes a plain 500 (the trace stage logs it with the trace id).
                // Boxed: the stages' future is large, and the trace stage moves what it runs
                // into its timeline and its span; a box moves as a pointer.
                Box::pin(async move {
                    match AssertUnwindSafe(stages).catch_unwind().await {
                        Ok(response) => response,
                        Err(panic) => super::middleware::panic_response(panic),
                    }
                })
            })
            .await;
            Ok(response)
        })
    }
}
