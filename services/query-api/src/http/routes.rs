//! The public routes' path templates, named once for the router and for the edge, which tells a
//! list page's batch from an item page by its route and labels the metrics with it. The edge runs
//! before routing (one stage around the whole router rather than a layer on every route), so it
//! names the route itself with [`template_of`]; a test holds it to the router's own matching.

/// One item's quote: an item page.
pub const ITEM_ROUTE: &str = "/api/v1/items/{platform}/{item_id}/rebate";

/// Up to `http.max_batch_items` quotes at once: a list page's items.
pub const BATCH_ROUTE: &str = "/api/v1/items:batch";

/// The template of the public route `path` matches, as the router matches it (a `{name}`
/// segment is any segment, even an empty one), or `None` when only the fallback would answer.
pub fn template_of(path: &str) -> Option<&'static str> {
    if path == BATCH_ROUTE {
        return Some(BATCH_ROUTE);
    }
    split_item_path(path).map(|_| ITEM_ROUTE)
}

/// The platform and item id of a single-item path whose segments need no decoding (no `%`), as
/// the router would extract them; `None` for any other path.
pub fn item_segments(path: &str) -> Option<(&str, &str)> {
    if path.contains('%') {
        return None;
    }
    split_item_path(path)
}

fn split_item_path(path: &str) -> Option<(&str, &str)> {
    let between = path
        .strip_prefix("/api/v1/items/")?
        .strip_suffix("/rebate")?;
    let (platform, item_id) = between.split_once('/')?;
    (!item_id.contains('/')).then_some((platform, item_id))
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::MatchedPath;
    use axum::http::Request;
    use axum::routing::any;
    use tower::ServiceExt;

    use super::*;

    /// What the router itself matches `path` to: the template, or "none" from the fallback.
    async fn routed(path: &str) -> String {
        let router = Router::new()
            .route(
                ITEM_ROUTE,
                any(|matched: MatchedPath| async move { matched.as_str().to_owned() }),
            )
            .route(
                BATCH_ROUTE,
                any(|matched: MatchedPath| async move { matched.as_str().to_owned() }),
            )
            .fallback(|| async { "none" });
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[test]
    fn item_segments_are_the_path_parameters() {
        assert_eq!(
            item_segments("/api/v1/items/taobao/100001/rebate"),
            Some(("taobao", "100001"))
        );
        assert_eq!(item_segments("/api/v1/items/jd//rebate"), Some(("jd", "")));
        assert_eq!(item_segments("/api/v1/items/jd/%31/rebate"), None);
    }

    #[tokio::test]
    async fn the_edge_names_the_route_the_router_matches() {
        for path in [
            "/api/v1/items/taobao/100001/rebate",
            "/api/v1/items/x/y/rebate",
            "/api/v1/items/taobao/100001/rebate/",
            "/api/v1/items/taobao//rebate",
            "/api/v1/items//100001/rebate",
            "/api/v1/items/taobao/100001/rebates",
            "/api/v1/items/taobao/100001",
            "/api/v1/items/a/b/c/rebate",
            "/api/v1/items/%20/1/rebate",
            "/api/v1/items:batch",
            "/api/v1/items:batch/",
            "/api/v1/items",
            "/api/v1/items/",
            "/",
            "/API/v1/items:batch",
        ] {
            let by_router = routed(path).await;
            let by_edge = template_of(path).unwrap_or("none");
            assert_eq!(by_edge, by_router, "{path}");
            // The fast path takes the item route's paths that need no decoding, and only those.
            assert_eq!(
                item_segments(path).is_some(),
                by_router == ITEM_ROUTE && !path.contains('%'),
                "{path}"
            );
        }
    }
}
