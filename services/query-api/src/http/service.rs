//! The public listener's service, [`Edge`]: every stage of [`super::edge`] and
//! [`super::middleware`] around the router, and the single-item route's fast path.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::HttpBody;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use futures::future::{Either, Ready, ready};
use rebate_domain::ItemKey;
use rebate_resilience::{KeyedLimiter, RequestClass};
use tower::ServiceExt;
use tracing::Instrument;

use super::cors::Cors;
use super::edge::Gate;
use super::middleware::{RequestObserver, Traced};
use super::protect::{self, Admitted, OwnedAdmitted};
use super::routes::{self, ITEM_ROUTE};
use super::validators;
use crate::metrics::{Answered, Route};
use crate::protection::Protection;
use crate::server::PeerService;
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

/// The future of [`Edge::call`]: an answer made before `call` returned (a hot item), or the
/// stages still running.
type EdgeFuture = Either<Ready<Result<Response, Infallible>>, BoxedAnswer>;
type BoxedAnswer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl tower::Service<Request> for Edge {
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let peer = protect::peer_of(&request);
        self.answer(request, peer, |_| {})
    }
}

impl PeerService for Edge {
    /// The hot path reads the peer from here; only a request it hands on to the general path
    /// carries it as the `ConnectInfo` extension.
    fn call_from(&mut self, peer: SocketAddr, request: Request) -> EdgeFuture {
        self.answer(request, Some(peer.ip()), |request| {
            request.extensions_mut().insert(ConnectInfo(peer));
        })
    }
}

impl Edge {
    /// The hot path for `request` from `peer`, else (after `before_general`) the general one.
    fn answer(
        &self,
        request: Request,
        peer: Option<IpAddr>,
        before_general: impl FnOnce(&mut Request),
    ) -> EdgeFuture {
        match self.shared.hot_item(request, peer) {
            Hot::Answered(response) => Either::Left(ready(Ok(response))),
            Hot::Continues(answer) => Either::Right(answer),
            Hot::Not(mut request) => {
                before_general(&mut request);
                self.general(request)
            }
        }
    }

    /// Every stage around the router, for a request the hot path did not take.
    fn general(&self, request: Request) -> EdgeFuture {
        let Edge { routes, shared } = self.clone();
        Either::Right(Box::pin(async move {
            let EdgeStages {
                observer,
                gate,
                state,
            } = &*shared;
            let cors = state.limits.cors.as_ref();
            let origin = cors.and_then(|cors| cors.origin_of(request.headers()));
            let response = super::middleware::traced(request, Some(observer), |request| {
                // An allowed origin's preflight: answered here, before the client limit and the
                // admission (it costs nothing and carries no query).
                let preflight = cors.and_then(|cors| cors.preflight(&request));
                let if_none_match = validators::if_none_match(request.headers());
                let stages = gate.run(request, |request| async move {
                    // The single-item route past the router when the hot path could not take
                    // it (say, the fleet's client buckets): the router's matching, parameter
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
                    if let Some(preflight) = preflight {
                        return preflight;
                    }
                    match AssertUnwindSafe(stages).catch_unwind().await {
                        Ok(response) => validators::conditional(if_none_match.as_ref(), response),
                        Err(panic) => super::middleware::panic_response(panic),
                    }
                })
            })
            .await;
            Ok(with_cors(cors, origin, response))
        }))
    }
}

/// The request headers a hot request whose rendering missed still needs, once the request
/// itself is gone.
struct Carried {
    origin: Option<HeaderValue>,
    if_none_match: Option<HeaderValue>,
    accept_encoding: Option<HeaderValue>,
}

/// What the hot path made of a request.
enum Hot {
    /// Answered without a future.
    Answered(Response),
    /// Taken: its stages ran, its answer is being assembled.
    Continues(BoxedAnswer),
    /// Not a hot item: untouched, for the stages and the router.
    Not(Request),
}

/// A request the hot path can take, with what its stages need.
struct HotCandidate<'a> {
    key: ItemKey,
    class: RequestClass,
    protection: &'a Arc<Protection>,
    /// This instance's client buckets and the trusted proxy hops (`None`: no client limit).
    limiter: Option<(&'a KeyedLimiter, u32)>,
}

/// Where the hot path's stages ended, without waiting.
enum HotStep<'a> {
    /// The response, the class it was served in (none when refused before admission) and what
    /// it answered.
    Done {
        response: Response,
        class: Option<RequestClass>,
        answered: Option<Answered>,
    },
    /// Admitted, but the kept rendering missed: the engine must assemble the quote.
    Assemble(Admitted<'a>),
}

impl EdgeStages {
    /// The hot path: a `GET` of one item whose stages need no waiting — its head within the
    /// caps, no body, this instance's client buckets — runs the same stages as any request, in
    /// the same order and with the same answers (trace, head caps, per-client limit, admission,
    /// the item's kept rendering), without the futures, boxes, timer and request extensions the
    /// general path pays; a valid kept rendering is answered before `call` returns. When the
    /// rendering misses, what is left (assembling the quote under the hard timeout) continues
    /// in one boxed future. Anything else — or a request that would be refused by a check the
    /// general path makes first — is handed back untouched.
    fn hot_item(self: &Arc<Self>, request: Request, peer: Option<IpAddr>) -> Hot {
        let Some(candidate) = self.hot_candidate(&request) else {
            return Hot::Not(request);
        };
        let (key, class, protection) = (candidate.key, candidate.class, candidate.protection);
        // From here on the request is this path's: each stage's effects happen exactly once.
        let trace = Traced::begin(&request, Some(Route::Matched(ITEM_ROUTE)));
        let _entered = trace.span.clone().entered();
        let step = Arc::clone(&trace.timeline).sync_scope(|| {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.hot_stages(&request, peer, candidate, &trace.trace_hex)
            }))
        });
        let observer = Some(&*self.observer);
        let cors = self.state.limits.cors.as_ref();
        let origin = cors.and_then(|cors| cors.origin_of(request.headers()));
        let finished = match step {
            Ok(HotStep::Done {
                response,
                class,
                answered,
            }) => trace.finish_with(response, observer, class, answered),
            Ok(HotStep::Assemble(admitted)) => {
                let admitted = admitted.into_owned(Arc::clone(protection));
                let headers = request.headers();
                let carried = Carried {
                    origin,
                    if_none_match: validators::if_none_match(headers),
                    accept_encoding: headers.get(header::ACCEPT_ENCODING).cloned(),
                };
                return Hot::Continues(Box::pin(
                    Arc::clone(self).assemble(trace, admitted, key, class, carried),
                ));
            }
            Err(panic) => trace.finish_with(
                super::middleware::panic_response(panic),
                observer,
                None,
                None,
            ),
        };
        Hot::Answered(with_cors(cors, origin, finished))
    }

    /// The item, class and guards of a request the hot path can take, checked without any
    /// effect: a `GET` on the item route without percent-encoding or a body, its head within
    /// the caps, a valid key and class, a class that would not wait for its admission, and
    /// client buckets (if any) that answer without waiting. The general path answers the rest,
    /// refusals and admission waits included.
    fn hot_candidate(&self, request: &Request) -> Option<HotCandidate<'_>> {
        let protection = self.gate.protection.as_ref()?;
        if request.method() != Method::GET || !request.body().is_end_stream() {
            return None;
        }
        let path = request.uri().path();
        let (platform, item_id) = routes::item_segments(path)?;
        if super::edge::head_error(&self.gate.limits, request).is_some() {
            return None;
        }
        let key = super::items::parse_key(platform, item_id).ok()?;
        let class = protect::request_class(path, request.headers()).ok()?;
        if protect::would_wait(protection, class) {
            // Its wait is a future; the general path has one.
            return None;
        }
        let limiter = match &protection.clients {
            Some(clients) => Some((clients.limiter.instance()?, clients.trusted_proxy_hops)),
            None => None,
        };
        Some(HotCandidate {
            key,
            class,
            protection,
            limiter,
        })
    }

    /// The stages of a hot request, in the general path's order: the per-client limit, the
    /// shedder's admission, the kept rendering.
    fn hot_stages<'a>(
        &self,
        request: &Request,
        peer: Option<IpAddr>,
        candidate: HotCandidate<'a>,
        trace_hex: &[u8; 32],
    ) -> HotStep<'a> {
        let HotCandidate {
            key,
            class,
            protection,
            limiter,
        } = candidate;
        if let Some((limiter, hops)) = limiter
            && let Err(refused) = protect::limit_client_now(limiter, hops, request.headers(), peer)
        {
            return HotStep::Done {
                response: refused.into_response(),
                class: None,
                answered: None,
            };
        }
        let admitted = match Admitted::begin(protection, class) {
            Ok(admitted) => admitted,
            Err(refused) => {
                return HotStep::Done {
                    response: refused.into_response(),
                    class: Some(class),
                    answered: None,
                };
            }
        };
        match super::items::quote_rendered(&self.state, trace_hex, key, request.headers()) {
            Some((response, answered)) => HotStep::Done {
                response: admitted.finish(validators::conditional(
                    request.headers().get(header::IF_NONE_MATCH),
                    response,
                )),
                class: Some(class),
                answered: Some(answered),
            },
            None => HotStep::Assemble(admitted),
        }
    }

    /// The rest of a hot request whose rendering missed: the quote assembled under the hard
    /// timeout, in the request's timeline (and span), a panic a plain 500.
    async fn assemble(
        self: Arc<Self>,
        trace: Traced,
        admitted: OwnedAdmitted,
        key: ItemKey,
        class: RequestClass,
        carried: Carried,
    ) -> Result<Response, Infallible> {
        let Carried {
            origin,
            if_none_match,
            accept_encoding,
        } = carried;
        let (trace_id, level, timeout) = (trace.trace_id, admitted.level, self.gate.timeout);
        let answer = super::middleware::with_timeout(timeout, async {
            let answer =
                super::items::quote_assembled(&self.state, trace_id, level, key, accept_encoding)
                    .await
                    .into_response();
            validators::conditional(if_none_match.as_ref(), answer)
        });
        let answer = Arc::clone(&trace.timeline)
            .scope(answer)
            .instrument(trace.span.clone());
        let (response, class) = match AssertUnwindSafe(answer).catch_unwind().await {
            Ok(response) => (admitted.finish(response), Some(class)),
            Err(panic) => {
                drop(admitted);
                (super::middleware::panic_response(panic), None)
            }
        };
        let answered = response.extensions().get::<Answered>().copied();
        let response = trace.finish_with(response, Some(&self.observer), class, answered);
        Ok(with_cors(self.state.limits.cors.as_ref(), origin, response))
    }
}

/// `response` with the CORS headers for `origin` (when CORS is configured).
fn with_cors(cors: Option<&Cors>, origin: Option<HeaderValue>, mut response: Response) -> Response {
    if let Some(cors) = cors {
        cors.decorate(origin, &mut response);
    }
    response
}
