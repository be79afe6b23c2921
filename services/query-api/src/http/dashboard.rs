//! The operator dashboard on the admin listener: `GET /dashboard` (the page) and its [`ASSETS`]
//! (`/dashboard/app.js`, `/dashboard/rules.js`, `/dashboard/app.css`). The page shows what
//! `GET /admin/v1/status` and the slow-request log say — shed level and load signals, each
//! dependency's breaker, bulkhead and quota, hit ratio per cache tier, the event bus, the
//! consistency observer, the recent slow requests and, for one trace id, its stages — and, from
//! `/admin/v1/rules` (`rules.js`), the live rules: the active version and its document, the
//! version each instance runs, a canary's progress and verdict, the history with diffs, and an
//! editor that dry-runs a document, shows its diff or the key a refusal names, applies it and
//! follows it until every instance runs it. Everything is refreshed every few seconds.
//!
//! Contract: the files live in `services/query-api/assets/dashboard/` and are compiled into
//! the binary, so an operator runs no build step and the page loads nothing from anywhere but the
//! admin listener (no CDN, no web font: operators' networks often have no internet). They carry
//! no data, so they are served without the token; every figure comes from the `/admin/v1` JSON
//! routes, which the script calls with the bearer token the operator types once and keeps only in
//! a variable (never in storage, a cookie or the URL: closing the tab forgets it, and nothing
//! else on the machine can read it). Every answer here carries a Content-Security-Policy that
//! allows this origin's script, style and fetches only, no inline script, no form submission
//! (so a page whose script failed cannot post the token into a URL) and no framing, plus
//! `nosniff` and no referrer. The page is revalidated on every load; the scripts and style sheet
//! are addressed by a hash of their content (`?v=`), so at that address they are cached for good
//! and a new binary's page asks for new addresses.

use axum::Router;
use axum::extract::RawQuery;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::LazyLock;

const PAGE: &str = include_str!("../../assets/dashboard/index.html");

/// A file the page loads: served at `/dashboard/{name}`, and named in `index.html` by the
/// placeholder `{{name}}`, which becomes its versioned address.
#[derive(Debug)]
struct Asset {
    name: &'static str,
    content_type: HeaderValue,
    body: &'static str,
    /// A hash of `body`: the `?v=` of its address.
    version: u64,
}

impl Asset {
    const fn new(name: &'static str, content_type: HeaderValue, body: &'static str) -> Self {
        Self {
            name,
            content_type,
            body,
            version: fnv1a(body.as_bytes()),
        }
    }

    /// Cached for good only when asked for at its current version: the same path with no
    /// version, or an older page's version, gets today's content revalidated on every use, so no
    /// cache keeps it under an address that promises other content.
    fn serve(&self, query: Option<&str>) -> Response {
        let current = query
            .and_then(|query| query.strip_prefix("v="))
            .and_then(|asked| u64::from_str_radix(asked, 16).ok())
            == Some(self.version);
        answer(
            self.content_type.clone(),
            if current { IMMUTABLE } else { REVALIDATE },
            self.body,
        )
    }
}

/// The page's scripts (the board, then the live-rules panel that plugs into it) and style sheet.
static ASSETS: [Asset; 3] = [
    Asset::new(
        "app.js",
        JAVASCRIPT,
        include_str!("../../assets/dashboard/app.js"),
    ),
    Asset::new(
        "rules.js",
        JAVASCRIPT,
        include_str!("../../assets/dashboard/rules.js"),
    ),
    Asset::new(
        "app.css",
        CSS,
        include_str!("../../assets/dashboard/app.css"),
    ),
];

const HTML: HeaderValue = HeaderValue::from_static("text/html; charset=utf-8");
const JAVASCRIPT: HeaderValue = HeaderValue::from_static("text/javascript; charset=utf-8");
const CSS: HeaderValue = HeaderValue::from_static("text/css; charset=utf-8");

/// `connect-src 'self'` is what lets the script reach `/admin/v1`; everything else is closed.
const CONTENT_SECURITY_POLICY: HeaderValue = HeaderValue::from_static(
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
);
/// The page: asked for again on every load (it is small), so a new binary's assets are found.
const REVALIDATE: HeaderValue = HeaderValue::from_static("no-cache");
/// An asset at its current content's address never changes.
const IMMUTABLE: HeaderValue = HeaderValue::from_static("max-age=31536000, immutable");

/// The page's path.
const PATH: &str = "/dashboard";

/// The routes, merged into the admin listener's outer router (beside `/metrics`, outside the
/// token layer, inside the trace stage and the gate).
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS
        .iter()
        .fold(Router::new().route(PATH, get(page)), |router, asset| {
            router.route(
                &format!("{PATH}/{}", asset.name),
                get(move |RawQuery(query): RawQuery| async move { asset.serve(query.as_deref()) }),
            )
        })
}

/// The page with the assets' versioned addresses filled in, built once.
static PAGE_WITH_ADDRESSES: LazyLock<String> = LazyLock::new(|| {
    ASSETS.iter().fold(PAGE.to_owned(), |page, asset| {
        page.replace(
            &format!("{{{{{}}}}}", asset.name),
            &format!("{PATH}/{}?v={:016x}", asset.name, asset.version),
        )
    })
});

async fn page() -> Response {
    answer(HTML, REVALIDATE, PAGE_WITH_ADDRESSES.as_str())
}

fn answer(content_type: HeaderValue, cache_control: HeaderValue, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 8] = [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, cache_control),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        // For browsers that predate `frame-ancestors`.
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    (headers, body).into_response()
}

/// 64-bit FNV-1a, evaluated at compile time: the assets' versions need to change when their
/// content does, not to resist anyone.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut index = 0;
    while index < bytes.len() {
        hash ^= bytes[index] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        index += 1;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(uri: &str) -> (StatusCode, axum::http::HeaderMap, String) {
        let response = routes::<()>()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    fn header<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> &'a str {
        headers
            .get(name)
            .unwrap_or_else(|| panic!("{name} is set"))
            .to_str()
            .unwrap()
    }

    /// The addresses the page asks for, in the order it names them.
    fn asset_addresses(page: &str) -> Vec<&str> {
        page.split(['"', '\''])
            .filter(|part| part.starts_with("/dashboard/"))
            .collect()
    }

    #[tokio::test]
    async fn the_page_names_its_assets_by_version_and_those_addresses_are_cached_for_good() {
        let (status, headers, page) = get(PATH).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "content-type"), "text/html; charset=utf-8");
        assert_eq!(header(&headers, "cache-control"), "no-cache");
        assert!(!page.contains("{{"), "every placeholder is filled in");
        let addresses = asset_addresses(&page);
        assert_eq!(addresses.len(), ASSETS.len(), "{addresses:?}");
        for asset in &ASSETS {
            let named: Vec<&&str> = addresses
                .iter()
                .filter(|address| address.starts_with(&format!("/dashboard/{}?v=", asset.name)))
                .collect();
            assert_eq!(named.len(), 1, "{} in {addresses:?}", asset.name);
            let address = *named[0];
            let (status, headers, body) = get(address).await;
            assert_eq!(status, StatusCode::OK, "{address}");
            assert_eq!(
                header(&headers, "cache-control"),
                "max-age=31536000, immutable"
            );
            assert_eq!(body, asset.body);
            assert_eq!(
                header(&headers, "content-type"),
                asset.content_type.to_str().unwrap()
            );
        }
    }

    #[tokio::test]
    async fn an_asset_without_its_current_version_is_revalidated() {
        for uri in [
            "/dashboard/app.js",
            "/dashboard/app.js?v=0000000000000000",
            "/dashboard/rules.js?v=0000000000000000",
            "/dashboard/app.css?v=not-hex",
            "/dashboard/app.css?x=1",
        ] {
            let (status, headers, _) = get(uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}");
            assert_eq!(header(&headers, "cache-control"), "no-cache", "{uri}");
        }
    }

    #[tokio::test]
    async fn every_answer_carries_the_security_headers() {
        let assets = ASSETS.iter().map(|asset| format!("{PATH}/{}", asset.name));
        for uri in std::iter::once(PATH.to_owned()).chain(assets) {
            let uri = uri.as_str();
            let (_, headers, _) = get(uri).await;
            let policy = header(&headers, "content-security-policy");
            for directive in [
                "default-src 'none'",
                "script-src 'self'",
                "connect-src 'self'",
                "form-action 'none'",
                "frame-ancestors 'none'",
            ] {
                assert!(policy.contains(directive), "{uri}: {policy}");
            }
            assert!(!policy.contains("unsafe"), "{policy}");
            assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
            assert_eq!(header(&headers, "x-frame-options"), "DENY");
            assert_eq!(header(&headers, "referrer-policy"), "no-referrer");
        }
    }

    /// The policy forbids inline script and style: markup that relied on either would render a
    /// broken page without any error on the server side.
    #[test]
    fn the_page_has_no_inline_script_or_style_and_loads_nothing_from_elsewhere() {
        let lower = PAGE.to_ascii_lowercase();
        for script_tag in lower.split("<script").skip(1) {
            let tag = &script_tag[..script_tag.find('>').unwrap()];
            assert!(tag.contains("src="), "an inline <script{tag}>");
            assert!(
                script_tag[script_tag.find('>').unwrap() + 1..].starts_with("</script>"),
                "a <script> with a body"
            );
        }
        assert!(!lower.contains("<style"), "an inline <style>");
        assert!(!lower.contains(" style="), "a style attribute");
        // Event-handler attributes (`onclick=`, …) are inline script too.
        let mut rest = lower.as_str();
        while let Some(at) = rest.find(" on") {
            let name: String = rest[at + 1..]
                .chars()
                .take_while(char::is_ascii_alphabetic)
                .collect();
            assert!(
                !rest[at + 1 + name.len()..].starts_with('='),
                "an inline handler {name}="
            );
            rest = &rest[at + 3..];
        }
        for text in std::iter::once(PAGE).chain(ASSETS.iter().map(|asset| asset.body)) {
            assert!(!text.contains("http://") && !text.contains("https://"));
            assert!(!text.contains("@import") && !text.contains("url("));
        }
    }

    fn scripts() -> impl Iterator<Item = &'static Asset> {
        ASSETS
            .iter()
            .filter(|asset| asset.content_type == JAVASCRIPT)
    }

    /// The scripts never turn data into markup, and keep the token out of anything that
    /// outlives the page.
    #[test]
    fn the_scripts_build_text_nodes_and_keep_the_token_in_memory() {
        assert_eq!(scripts().count(), 2);
        for script in scripts() {
            check_script(script);
        }
    }

    fn check_script(script: &Asset) {
        let name = script.name;
        let body = script.body;
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "localStorage",
            "sessionStorage",
            "document.cookie",
            "indexedDB",
            "history.pushState",
            "history.replaceState",
            "location.hash =",
        ] {
            assert!(!body.contains(forbidden), "{name} uses {forbidden}");
        }
        assert!(
            body.contains("textContent") || body.contains("createTextNode"),
            "{name}"
        );
    }

    #[test]
    fn a_change_of_content_is_a_change_of_version() {
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        let mut versions: Vec<u64> = ASSETS.iter().map(|asset| asset.version).collect();
        versions.sort_unstable();
        versions.dedup();
        assert_eq!(versions.len(), ASSETS.len());
        // The published FNV-1a 64 test vector.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
