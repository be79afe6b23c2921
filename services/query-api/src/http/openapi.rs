//! The OpenAPI 3.1 document of both listeners, `docs/openapi.json`: the public API (tag
//! `public`, on `http.listen`) and the admin API (tag `admin`, on `admin.listen`), every status
//! each route answers and every header it sets. It is derived at compile time (utoipa) from the
//! `#[utoipa::path]` annotations on the handlers themselves and from the schema types in
//! [`super::schemas`], which mirror the JSON the service writes, kept renderings included; nothing here
//! runs on the request path. The admin listener serves the document as `GET /openapi.json`;
//! `rebate-query openapi` prints it, and a test keeps the committed file equal to that output.
//!
//! What every route of a listener can answer because of the stages around the routes (the
//! gate's 408/413/414/431, the hard timeout's 503, the panic catcher's 500, and on the public
//! listener the client limit's 429 and the shedder's 503) is added to each operation here, in
//! one place, rather than repeated on every handler. OpenAPI has no `required` for a response
//! header; the document marks every header it lists as required except the few that only some
//! answers carry ([`OPTIONAL_HEADERS`]), so that a checker holds the service to them.

use serde_json::Value;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::server::{Server, ServerBuilder};
use utoipa::openapi::{Content, OpenApi as Document, RefOr};
use utoipa::{Modify, OpenApi};

use super::admin;
use super::items;
use super::rules;
use super::slow_requests;

/// Response headers only some answers carry: compression's, the shedder's, CORS's (only with
/// `http.cors` configured and an allowed `Origin`) and `connection: close`.
pub const OPTIONAL_HEADERS: &[&str] = &[
    "content-encoding",
    "vary",
    "x-shed-level",
    "server-timing",
    "access-control-allow-origin",
    "access-control-expose-headers",
    "access-control-allow-credentials",
    "connection",
    "accept-encoding",
];

/// The name of the admin token's security scheme.
const ADMIN_TOKEN: &str = "admin_token";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "rebate-query",
        description = "The rebate query service. The public API (tag `public`) is served on \
            `http.listen` (127.0.0.1:8080 by default), the admin API (tag `admin`) on \
            `admin.listen` (127.0.0.1:8090); under `/admin/v1` every route, its unknown paths \
            and methods included, needs `Authorization: Bearer <token>`. Every answer carries \
            `x-trace-id`; every error body is `{\"error\":{\"code\",\"message\"},\"trace_id\"}`, \
            `error.field` added for `invalid_rule`. \
            A method a route does not take is `405 method_not_allowed` with `Allow`; a path no \
            route takes is `404 route_not_found`. A connection over `http.max_connections` or \
            `http.max_connections_per_peer` is answered `503 too_many_connections` (with \
            `Retry-After`) and closed. Generated from the code: `rebate-query openapi`."
    ),
    paths(
        items::item_rebate,
        items::batch_rebate,
        admin::healthz,
        admin::readiness,
        admin::metrics,
        admin::openapi_json,
        admin::status,
        admin::force_shedding,
        admin::publish_event,
        admin::inspect_item,
        admin::warm,
        admin::submit_warm_job,
        admin::warm_job_progress,
        admin::hot_keys,
        slow_requests::recent,
        slow_requests::by_trace_id,
        rules::overview,
        rules::history,
        rules::version,
        rules::create,
        rules::promote,
        rules::abort,
        rules::rollback,
    ),
    modifiers(&EdgeResponses),
    tags(
        (name = "public", description = "The public API, on `http.listen`."),
        (name = "admin", description = "Health, metrics and the operators' API, on `admin.listen`."),
    )
)]
struct ApiDoc;

/// The whole of `docs/openapi.json`: the document, pretty-printed, with a final newline.
pub fn render() -> String {
    let mut document = serde_json::to_value(ApiDoc::openapi())
        .expect("an OpenAPI document is plain data and serialises");
    mark_required_headers(&mut document);
    share_headers(&mut document);
    strip_null_from_optional_inputs(&mut document);
    // utoipa has no `unique_items`; the service refuses an event naming an item twice.
    if let Some(item_ids) =
        document.pointer_mut("/components/schemas/EventRequest/properties/item_ids")
        && let Some(item_ids) = item_ids.as_object_mut()
    {
        item_ids.insert("uniqueItems".to_owned(), Value::Bool(true));
    }
    let mut text = serde_json::to_string_pretty(&document).expect("a JSON value serialises");
    text.push('\n');
    text
}

/// Sets `required: true` on every response header but [`OPTIONAL_HEADERS`] (utoipa's header
/// object has no such field).
fn mark_required_headers(document: &mut Value) {
    if let Some(responses) = document
        .pointer_mut("/components/responses")
        .and_then(Value::as_object_mut)
    {
        responses.values_mut().for_each(mark_required);
    }
    if let Some(responses) = document_paths(document) {
        responses.into_iter().for_each(mark_required);
    }
}

/// [`mark_required_headers`] for one response object.
fn mark_required(response: &mut Value) {
    let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, header) in headers.iter_mut() {
        if !OPTIONAL_HEADERS.contains(&name.as_str())
            && let Some(header) = header.as_object_mut()
        {
            header.insert("required".to_owned(), Value::Bool(true));
        }
    }
}

/// An optional header, query parameter or request body is absent or a value: utoipa writes an
/// `Option`'s schema as nullable, which would make the text `null` a valid `x-request-class`,
/// or a valid body of `POST /admin/v1/rules/{version}/promote`.
fn strip_null_from_optional_inputs(document: &mut Value) {
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for operation in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
    {
        if let Some(parameters) = operation
            .get_mut("parameters")
            .and_then(Value::as_array_mut)
        {
            parameters
                .iter_mut()
                .filter_map(|parameter| parameter.get_mut("schema"))
                .for_each(strip_null);
        }
        let optional_body = operation
            .get_mut("requestBody")
            .filter(|body| body.get("required") != Some(&Value::Bool(true)))
            .and_then(|body| body.get_mut("content")?.as_object_mut());
        if let Some(content) = optional_body {
            content
                .values_mut()
                .filter_map(|media| media.get_mut("schema"))
                .for_each(strip_null);
        }
    }
}

/// [`strip_null_from_optional_inputs`] for one schema: `null` leaves its `type` list and its
/// `oneOf` choices.
fn strip_null(schema: &mut Value) {
    let Some(schema) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|kind| kind != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            schema.insert("type".to_owned(), only);
        }
    }
    if let Some(Value::Array(choices)) = schema.get("oneOf") {
        let kept: Vec<Value> = choices
            .iter()
            .filter(|choice| choice.get("type").is_none_or(|kind| kind != "null"))
            .cloned()
            .collect();
        schema.remove("oneOf");
        match <[Value; 1]>::try_from(kept) {
            Ok([only]) => {
                if let Value::Object(only) = only {
                    schema.extend(only);
                }
            }
            Err(kept) => {
                schema.insert("oneOf".to_owned(), Value::Array(kept));
            }
        }
    }
}

/// Moves each header that many responses carry alike (the trace id, `Retry-After`, CORS's, …)
/// to `components/headers`, leaving a `$ref` behind: the document lists each once.
fn share_headers(document: &mut Value) {
    let mut shared = serde_json::Map::new();
    if let Some(responses) = document_paths(document) {
        for response in responses {
            let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) else {
                continue;
            };
            for (name, header) in headers.iter_mut() {
                let first = shared.entry(name.clone()).or_insert_with(|| header.clone());
                if first == header {
                    *header = serde_json::json!({ "$ref": format!("#/components/headers/{name}") });
                }
            }
        }
    }
    if let Some(components) = document
        .get_mut("components")
        .and_then(Value::as_object_mut)
    {
        components.insert("headers".to_owned(), Value::Object(shared));
    }
}

/// Every inline response object of every operation.
fn document_paths(document: &mut Value) -> Option<Vec<&mut Value>> {
    let paths = document.get_mut("paths")?.as_object_mut()?;
    Some(
        paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
            .filter_map(|operation| operation.get_mut("responses")?.as_object_mut())
            .flat_map(|responses| responses.values_mut())
            .collect(),
    )
}

/// Adds what the stages around the routes answer to every operation, the servers of each
/// listener, and the admin token's scheme.
struct EdgeResponses;

impl Modify for EdgeResponses {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            ADMIN_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token: `admin.token`, else the file `admin.token_file` \
                         (written with a random token at start when absent).",
                    ))
                    .build(),
            ),
        );
        let shared: std::collections::HashMap<&str, Response> =
            shared_responses().into_iter().collect();
        let public = server("http://127.0.0.1:8080", "The public API (`http.listen`).");
        let admin = server(
            "http://127.0.0.1:8090",
            "The admin listener (`admin.listen`).",
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            let is_public = path.starts_with("/api/");
            item.servers = Some(vec![if is_public {
                public.clone()
            } else {
                admin.clone()
            }]);
            let protected = path.starts_with("/admin/v1/");
            for operation in operations(item) {
                // The edge's statuses every listener answers, then each kind of route's own.
                const EVERY_ROUTE: [(&str, &str); 5] = [
                    ("408", "RequestTimeout"),
                    ("413", "PayloadTooLarge"),
                    ("414", "UriTooLong"),
                    ("431", "HeadersTooLarge"),
                    ("500", "Internal"),
                ];
                let own: &[(&str, &str)] = if is_public {
                    &[("429", "RateLimited"), ("503", "Unavailable")]
                } else if protected {
                    &[
                        ("401", "Unauthorized"),
                        ("429", "AdminThrottled"),
                        ("503", "AdminUnavailable"),
                    ]
                } else {
                    // `/readyz` keeps its own 503 (the readiness body).
                    &[("503", "AdminUnavailable")]
                };
                for (status, name) in EVERY_ROUTE.iter().chain(own) {
                    operation
                        .responses
                        .responses
                        .entry((*status).to_owned())
                        .or_insert_with(|| RefOr::T(shared[name].clone()));
                }
                // The head checks' 400 and 415: added to a route's own answer of that status.
                for (status, name) in [("400", "BadRequest"), ("415", "UnsupportedEncoding")] {
                    let edge = &shared[name];
                    match operation.responses.responses.entry(status.to_owned()) {
                        std::collections::btree_map::Entry::Vacant(vacant) => {
                            vacant.insert(RefOr::T(edge.clone()));
                        }
                        std::collections::btree_map::Entry::Occupied(mut occupied) => {
                            if let RefOr::T(own) = occupied.get_mut() {
                                own.description =
                                    format!("{} Or {}", own.description, edge.description);
                                for (header, value) in &edge.headers {
                                    own.headers
                                        .entry(header.clone())
                                        .or_insert_with(|| value.clone());
                                }
                            }
                        }
                    }
                }
                for (status, response) in operation.responses.responses.iter_mut() {
                    if let RefOr::T(response) = response {
                        response
                            .headers
                            .insert("x-trace-id".to_owned(), trace_header().into());
                        if is_public {
                            add_public_headers(&mut response.headers);
                            // Every public route answers quotes (one, or a batch of them).
                            add_validator_headers(status, &mut response.headers);
                        }
                    }
                }
                if protected {
                    operation.security =
                        Some(vec![utoipa::openapi::security::SecurityRequirement::new(
                            ADMIN_TOKEN,
                            Vec::<String>::new(),
                        )]);
                }
            }
        }
    }
}

/// What any answer of the public listener may carry besides its own headers: the shed level,
/// the admission wait's `Server-Timing`, and CORS's for an allowed origin.
fn add_public_headers(
    headers: &mut std::collections::BTreeMap<String, RefOr<utoipa::openapi::header::Header>>,
) {
    headers.insert("x-shed-level".to_owned(), shed_level_header().into());
    headers.insert(
        "server-timing".to_owned(),
        header(
            "On a request that queued for admission (a prefetch over the limit): \
             `admission;desc=admitted|timed_out|full;dur=MILLISECONDS`, how its wait ended and \
             how long it was.",
        )
        .into(),
    );
    headers.insert(
        "access-control-allow-origin".to_owned(),
        header("The request's `Origin` when `http.cors.allowed_origins` lists it (or `*`).").into(),
    );
    headers.insert(
        "access-control-expose-headers".to_owned(),
        header(
            "`x-trace-id, retry-after, x-shed-level, server-timing, etag`, for an allowed origin.",
        )
        .into(),
    );
    headers.insert(
        "access-control-allow-credentials".to_owned(),
        header("`true` for an allowed origin when `http.cors.allow_credentials` is on.").into(),
    );
}

/// A quote answer's validators and freshness (`http/validators.rs`, `http/encoding.rs`): on its
/// `200`, and as the `200` would have said them on its `304`.
fn add_validator_headers(
    status: &str,
    headers: &mut std::collections::BTreeMap<String, RefOr<utoipa::openapi::header::Header>>,
) {
    let (etag, cache_control, vary) = match status {
        "200" => (
            "Strong tag over the answer without its trace id, `-br` or `-gzip` appended when \
             compressed.",
            "`private, max-age=N` (kept rendering: whole seconds it stays what the service \
             would answer, ≤ 300) or `private, no-cache` (degraded or assembled: revalidate).",
            "`accept-encoding` for an answer large enough to compress; `origin` with a CORS \
             origin list.",
        ),
        "304" => (
            "The tag named in `If-None-Match`.",
            "As the `200` would have said.",
            "As the `200` would have said.",
        ),
        _ => return,
    };
    headers.insert("etag".to_owned(), header(etag).into());
    headers.insert("cache-control".to_owned(), header(cache_control).into());
    headers.insert("vary".to_owned(), header(vary).into());
    if status == "200" {
        headers.insert(
            "content-encoding".to_owned(),
            header(
                "`br` or `gzip`: answers of at least `http.compression.min_bytes` when \
                 `Accept-Encoding` takes one.",
            )
            .into(),
        );
    }
}

fn server(url: &str, description: &str) -> Server {
    ServerBuilder::new()
        .url(url)
        .description(Some(description))
        .build()
}

fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        item.get.as_mut(),
        item.put.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.options.as_mut(),
        item.head.as_mut(),
        item.patch.as_mut(),
        item.trace.as_mut(),
    ]
    .into_iter()
    .flatten()
}

/// A string header.
fn header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(Object::with_type(Type::String)))
        .description(Some(description))
        .build()
}

/// An integer header.
fn integer_header(description: &str, minimum: u32) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(minimum)),
        ))
        .description(Some(description))
        .build()
}

/// The trace id header every answer carries.
pub fn trace_header() -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[0-9a-f]{32}$")),
        ))
        .description(Some(
            "The request's trace id: the incoming W3C `traceparent`'s, else a new one. Give it to \
             `GET /admin/v1/slow-requests/{trace_id}` to see where the time went.",
        ))
        .build()
}

/// An error answer with `description`: the error envelope, the trace id and `extra` headers.
fn error_response(
    description: &str,
    extra: Vec<(&str, utoipa::openapi::header::Header)>,
) -> Response {
    let mut builder = ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            Content::new(Some(utoipa::openapi::Ref::from_schema_name(
                "ErrorEnvelope",
            ))),
        )
        .header("x-trace-id", trace_header());
    for (name, header) in extra {
        builder = builder.header(name, header);
    }
    builder.build()
}

fn retry_after() -> utoipa::openapi::header::Header {
    integer_header("Seconds to wait before asking again.", 1)
}

fn connection_close() -> utoipa::openapi::header::Header {
    header("`close`: body bytes were left unread, so the connection ends with this answer.")
}

/// The responses every operation of a listener shares, by component name.
fn shared_responses() -> Vec<(&'static str, Response)> {
    vec![
        (
            "BadRequest",
            error_response(
                "`invalid_host` (an HTTP/1.1 request without `Host`, or a request with two or \
                 one that is not `host[:port]`) or `invalid_transfer_encoding` (a \
                 `Transfer-Encoding` other than `chunked` once; one whose last coding is not \
                 `chunked` gets a bare 400 from the HTTP parser); the connection is closed.",
                vec![("connection", connection_close())],
            ),
        ),
        (
            "UnsupportedEncoding",
            error_response(
                "`unsupported_content_encoding`: a body with a `Content-Encoding` other than \
                 `identity`; the API takes plain JSON. The connection is closed.",
                vec![
                    (
                        "accept-encoding",
                        header("`identity`: the only coding a request body may have."),
                    ),
                    ("connection", connection_close()),
                ],
            ),
        ),
        (
            "RequestTimeout",
            error_response(
                "`request_timeout`: the body did not arrive within `http.body_read_timeout_ms`; \
                 the connection is closed.",
                vec![("connection", connection_close())],
            ),
        ),
        (
            "PayloadTooLarge",
            error_response(
                "`payload_too_large`: the body, or its declared `Content-Length`, is over \
                 `http.body_limit_bytes` (64 KiB); refused before the body is read. A chunk \
                 announcing more than the listener's largest body limit is refused as soon as \
                 its size line arrives.",
                vec![("connection", connection_close())],
            ),
        ),
        (
            "UriTooLong",
            error_response(
                "`uri_too_long`: the request target is over `http.max_uri_bytes`.",
                vec![("connection", connection_close())],
            ),
        ),
        (
            "HeadersTooLarge",
            error_response(
                "`headers_too_large`: the headers are over `http.max_header_bytes` or \
                 `http.max_headers`.",
                vec![("connection", connection_close())],
            ),
        ),
        (
            "RateLimited",
            error_response(
                "`rate_limited`: this client (`x-client-id`, else its address) is over its \
                 limit (`resilience.client_limit`); `invalid_client_id` and \
                 `invalid_request_class` are 400s of the same stage.",
                vec![("retry-after", retry_after())],
            ),
        ),
        (
            "Internal",
            error_response(
                "`internal`: a bug; the cause is in the log under the trace id, never in the \
                 answer.",
                Vec::new(),
            ),
        ),
        (
            "Unavailable",
            error_response(
                "`overloaded` (shedding at level 3 with nothing cached, or a prefetch over the \
                 limit whose admission queue was full or whose wait ran out: `Retry-After` \
                 jittered 1–5 s), `unavailable` (the catalogue is down \
                 and nothing stale is cached), `timeout` (the request hit \
                 `http.request_timeout_ms`) or `too_many_connections` (then closed).",
                vec![
                    ("retry-after", retry_after()),
                    ("x-shed-level", shed_level_header()),
                    ("connection", connection_close()),
                ],
            ),
        ),
        (
            "AdminUnavailable",
            error_response(
                "`timeout` (the request hit `admin.request_timeout_ms`), `unavailable` (the \
                 event broker is unreachable, for events; the rule store failed, for rules) or \
                 `too_many_connections` (then closed).",
                vec![
                    ("retry-after", retry_after()),
                    ("connection", connection_close()),
                ],
            ),
        ),
        (
            "Unauthorized",
            error_response(
                "`unauthorized`: no `Authorization: Bearer` header, or not the admin token.",
                vec![(
                    "www-authenticate",
                    header(
                        "`Bearer realm=\"rebate-admin\"`, with `error=\"invalid_token\"` when a \
                         token was offered (RFC 6750 §3).",
                    ),
                )],
            ),
        ),
        (
            "AdminThrottled",
            error_response(
                "`rate_limited`: this address offered `admin.auth_throttle.max_failures` wrong \
                 tokens; every request it sends under `/admin/v1` is refused, its token unread, \
                 until `Retry-After` has passed.",
                vec![("retry-after", retry_after())],
            ),
        ),
    ]
}

/// `x-shed-level`: set while shedding.
pub fn shed_level_header() -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(3)),
        ))
        .description(Some(
            "The load-shedding level the request was served at, when at least 1 (1: extras \
             from cache only, 2: shorter timeouts, 3: cache only).",
        ))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_document_is_what_the_code_renders() {
        let committed = include_str!("../../../../docs/openapi.json");
        assert!(
            committed == render(),
            "docs/openapi.json is out of date: run \
             `cargo run -p query-api -- openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn every_operation_documents_its_trace_id_and_the_edge_statuses() {
        let document: Value = serde_json::from_str(&render()).unwrap();
        assert_eq!(document["openapi"], "3.1.0");
        let paths = document["paths"].as_object().unwrap();
        assert_eq!(paths.len(), 22, "{:?}", paths.keys());
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                if method == "servers" {
                    continue;
                }
                let responses = operation["responses"].as_object().unwrap();
                for status in ["400", "408", "413", "414", "415", "431", "500", "503"] {
                    assert!(responses.contains_key(status), "{method} {path}: {status}");
                }
                // The public API's client limit, and the admin token's throttle.
                assert_eq!(
                    responses.contains_key("429"),
                    path.starts_with("/api/") || path.starts_with("/admin/v1/"),
                    "{method} {path}"
                );
                assert_eq!(
                    responses.contains_key("401"),
                    path.starts_with("/admin/v1/"),
                    "{method} {path}"
                );
                for (status, response) in responses {
                    assert_eq!(
                        response["headers"]["x-trace-id"]["$ref"],
                        "#/components/headers/x-trace-id",
                        "{method} {path} {status}"
                    );
                }
            }
        }
        assert_eq!(
            document["components"]["headers"]["x-trace-id"]["required"],
            true
        );
        assert!(
            document["components"]["headers"]["vary"]
                .get("required")
                .is_none()
        );
    }
}
