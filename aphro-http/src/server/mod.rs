//! The embeddable router builder for aphro's three server roles.
//!
//! [`Server::builder`] builds any role from plain values (what the CLI does with its flags);
//! a Rust application can mount the result in its own axum server:
//!
//! ```no_run
//! # async fn demo(state: aphro_http::server::AppState) {
//! let app: axum::Router = aphro_http::server::router(state);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
pub mod anthropic;
pub mod audio;
pub mod builder;
mod common;
pub mod engine;
mod generative_scoring;
pub mod kobold;
pub mod openai;
pub mod openapi;
pub mod pooling;
pub mod render;

use crate::auth::{require_api_key, ApiKeys};
use crate::error::route_not_found;
use crate::extract::BodyLimit;
use crate::metrics::Metrics;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
pub use builder::{FrontendOptions, Server, ServerBuilder};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Which routes a server mounts (`api.md` §0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// GPU-less frontend: render, derender, tokenize, models, health, version, metrics.
    Render,
    /// Token-in/token-out engine: generate, abort, models, health, metrics.
    TokensOnly,
    /// Everything: the OpenAI API plus render, derender and generate.
    Full,
    /// A pooling model (`--runner pooling`): the pooling routes its task allows (see
    /// [`pooling::PoolingRoutes`]) plus the common routes.
    Pooling,
    /// A speech-to-text model (Whisper): `/v1/audio/transcriptions`, `/v1/audio/translations`
    /// plus the common routes.
    Speech,
}

/// Settings shared by every role.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub role: Role,
    /// Names clients may use in `model`; the first is reported by default.
    pub served_model_names: Vec<String>,
    /// What `/v1/models` reports as `root` (the model path or hub id).
    pub model_root: String,
    pub max_model_len: usize,
    pub api_keys: Vec<String>,
    pub enable_request_id_headers: bool,
    /// Largest request body, on every route that reads one (`--max-request-body-bytes`).
    pub max_body_bytes: usize,
    /// Time a client has to send a whole body (`--request-body-timeout`).
    pub body_read_timeout: std::time::Duration,
    /// `--enable-scale-out`: the integrated server (`Role::Full`) also mounts the render,
    /// derender and generate routes; without it they answer 403, as vLLM's do. The render and
    /// tokens-only roles always mount theirs.
    pub enable_scale_out: bool,
    /// `--skip-tokenizer-init`: no renderer or derenderer; text routes answer 400.
    pub skip_tokenizer_init: bool,
    /// `--launch-kobold-api`: the integrated server also mounts the Kobold routes (`/api/...`).
    pub launch_kobold_api: bool,
}

/// Engine liveness, shared between the step loop's error path and `/health`.
#[derive(Debug, Default)]
pub struct Health {
    fatal: RwLock<Option<String>>,
}

impl Health {
    pub fn mark_dead(&self, reason: impl Into<String>) {
        if let Ok(mut g) = self.fatal.write() {
            g.get_or_insert(reason.into());
        }
    }

    pub fn fatal_reason(&self) -> Option<String> {
        self.fatal.read().ok().and_then(|g| g.clone())
    }
}

/// Everything a handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<ServerSettings>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub created: u64,
    /// Present unless the server runs `--tokens-only`.
    pub renderer: Option<Arc<aphro_core::Renderer>>,
    /// Present unless the server runs `--tokens-only`.
    pub derenderer: Option<Arc<aphro_core::derenderer::Derenderer>>,
    /// Present on `aphro serve` (with or without `--tokens-only`).
    pub engine: Option<Arc<aphro_engine::serving::ServingEngine>>,
    /// Admits CPU-bound request work (render, tokenize, derender) a core's worth at a time.
    pub cpu: Arc<CpuGate>,
    /// The Kobold routes' running generations (with `--launch-kobold-api`).
    pub kobold: Option<Arc<aphro_engine::kobold::KoboldServing>>,
    /// The pooling model of `Role::Pooling`.
    pub embedder: Option<Arc<aphro_engine::pooling::Embedder>>,
    /// The speech model of `Role::Speech`.
    pub speech: Option<Arc<audio::SpeechServing>>,
}

/// Runs CPU-bound request work (render, tokenize, derender) at most one job per core at a
/// time.
///
/// A job from a body of up to [`INLINE_BODY_LIMIT`] bytes runs on the async worker that
/// handles the request: handing it to the blocking pool and back costs two thread wake-ups
/// and context switches, which measured as much as the render itself (render throughput on
/// two cores doubled without them, `scripts/bench_render.sh`). Larger or unsized bodies
/// (the rare long jobs) go to the blocking pool so they cannot hold a worker for long.
///
/// Without the bound every concurrent request would run at once: 64 clients on two cores
/// time-slicing templates and encodes with cold caches, and a tail latency set by the
/// scheduler. Waiting for a permit costs no thread, and the semaphore is fair, so requests
/// start in arrival order.
#[derive(Debug)]
pub struct CpuGate {
    permits: tokio::sync::Semaphore,
}

/// The largest request body whose CPU work runs inline on an async worker (about 60k tokens
/// of chat text: a few milliseconds of render).
pub const INLINE_BODY_LIMIT: u64 = 256 << 10;

/// The request's `Content-Length`, if it sent one.
pub fn content_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

impl CpuGate {
    /// One permit per available core.
    pub fn per_core() -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            permits: tokio::sync::Semaphore::new(n),
        }
    }

    /// Runs `f` once a permit is free: inline for a body of known size up to
    /// [`INLINE_BODY_LIMIT`], on the blocking pool otherwise.
    pub async fn run<T, E, F>(
        &self,
        body_len: Option<u64>,
        f: F,
    ) -> Result<T, crate::error::ApiError>
    where
        F: FnOnce() -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
        crate::error::ApiError: From<E>,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| crate::error::ApiError::internal(e.to_string()))?;
        if body_len.is_some_and(|n| n <= INLINE_BODY_LIMIT) {
            // A panic answers 500, as a panicking blocking task does, instead of dropping the
            // connection with the worker's task.
            return match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                Ok(r) => Ok(r?),
                Err(_) => Err(crate::error::ApiError::internal(
                    "request processing panicked",
                )),
            };
        }
        Ok(tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| crate::error::ApiError::internal(e.to_string()))??)
    }
}

impl AppState {
    pub fn with_renderer(mut self, renderer: Arc<aphro_core::Renderer>) -> Self {
        self.renderer = Some(renderer);
        self
    }

    pub fn with_derenderer(mut self, derenderer: Arc<aphro_core::derenderer::Derenderer>) -> Self {
        self.derenderer = Some(derenderer);
        self
    }

    pub fn with_engine(mut self, engine: Arc<aphro_engine::serving::ServingEngine>) -> Self {
        self.engine = Some(engine);
        self
    }

    pub fn with_speech(mut self, speech: Arc<audio::SpeechServing>) -> Self {
        self.speech = Some(speech);
        self
    }

    pub fn with_embedder(mut self, embedder: Arc<aphro_engine::pooling::Embedder>) -> Self {
        self.embedder = Some(embedder);
        self
    }

    /// Serves the Kobold routes over this state's renderer, derenderer and engine (the
    /// router mounts them when `settings.launch_kobold_api` is set). A no-op on a role
    /// without all three.
    pub fn with_kobold(mut self) -> Self {
        if let (Some(r), Some(d), Some(e)) = (&self.renderer, &self.derenderer, &self.engine) {
            let serving = aphro_engine::openai::OpenAiServing::new(r.clone(), d.clone(), e.clone());
            self.kobold = Some(Arc::new(aphro_engine::kobold::KoboldServing::new(serving)));
        }
        self
    }

    pub fn new(settings: ServerSettings) -> Self {
        let name = settings
            .served_model_names
            .first()
            .cloned()
            .unwrap_or_default();
        AppState {
            metrics: Arc::new(Metrics::new(&name)),
            settings: Arc::new(settings),
            health: Arc::new(Health::default()),
            created: unix_now(),
            renderer: None,
            derenderer: None,
            engine: None,
            cpu: Arc::new(CpuGate::per_core()),
            kobold: None,
            embedder: None,
            speech: None,
        }
    }

    /// The served name for a request's `model` field, or the vLLM 404.
    pub fn resolve_model(&self, requested: Option<&str>) -> Result<String, crate::error::ApiError> {
        let names = &self.settings.served_model_names;
        match requested {
            None => Ok(names.first().cloned().unwrap_or_default()),
            Some(m) if names.iter().any(|n| n == m) => Ok(m.to_owned()),
            Some(m) => Err(crate::error::ApiError::unknown_model(m, names)),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The routes a role mounts, each registered together with its OpenAPI operation.
fn role_routes(
    role: Role,
    scale_out: bool,
    kobold: bool,
    pooling_routes: pooling::PoolingRoutes,
) -> utoipa_axum::router::OpenApiRouter<AppState> {
    let mut app = common::routes();
    match role {
        Role::Render => app = app.merge(render::routes()).merge(anthropic::count_routes()),
        Role::TokensOnly => {
            app = app.merge(engine::routes(true));
            if engine::dev_mode() {
                app = app.merge(engine::dev_routes());
            }
        }
        Role::Pooling => app = app.merge(pooling::routes(pooling_routes)),
        Role::Speech => app = app.merge(audio::routes()),
        Role::Full => {
            app = app
                .merge(render::utility_routes())
                .merge(openai::routes())
                .merge(anthropic::routes())
                .merge(anthropic::count_routes())
                .merge(generative_scoring::routes());
            if kobold {
                app = app.merge(self::kobold::routes());
            }
            if engine::dev_mode() {
                app = app.merge(engine::dev_routes());
            }
            if scale_out {
                app = app
                    .merge(render::scale_out_routes())
                    .merge(engine::routes(false));
            }
        }
    }
    app
}

/// What the integrated server answers on a scale-out route without `--enable-scale-out`.
const SCALE_OUT_DISABLED: &str =
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.";

/// The scale-out routes answering 403 (POST only, and not in the OpenAPI document, as vLLM
/// registers them with `include_in_schema=False`).
fn scale_out_disabled(app: Router<AppState>) -> Router<AppState> {
    let scale_out = render::scale_out_routes().merge(engine::routes(false));
    let (_, doc) = scale_out.split_for_parts();
    doc.paths.paths.keys().fold(app, |app, path| {
        app.route(
            path,
            axum::routing::post(|| async {
                crate::error::ApiError::new(
                    axum::http::StatusCode::FORBIDDEN,
                    "PermissionDeniedError",
                    SCALE_OUT_DISABLED,
                )
            }),
        )
    })
}

/// The OpenAPI document of a role: exactly the routes [`router`] mounts for it (plus nothing
/// else; `/openapi.json` and `/docs` describe the API rather than belong to it, as in FastAPI).
pub fn openapi_document(role: Role, enable_scale_out: bool) -> utoipa::openapi::OpenApi {
    openapi_document_with(role, enable_scale_out, false)
}

/// [`openapi_document`], with or without the Kobold routes (`--launch-kobold-api`).
pub fn openapi_document_with(
    role: Role,
    enable_scale_out: bool,
    kobold: bool,
) -> utoipa::openapi::OpenApi {
    openapi::finish(
        role_routes(
            role,
            enable_scale_out,
            kobold,
            pooling::PoolingRoutes::default(),
        )
        .split_for_parts()
        .1,
    )
}

/// Build the router for `state.settings.role`, with `/openapi.json` and `/docs`.
pub fn router(state: AppState) -> Router {
    router_with(state, true)
}

/// [`router`], with or without the API document routes (`/openapi.json`, `/docs`).
pub fn router_with(state: AppState, docs: bool) -> Router {
    let limit = BodyLimit {
        max_bytes: state.settings.max_body_bytes,
        read_timeout: state.settings.body_read_timeout,
    };
    let keys = ApiKeys::new(state.settings.api_keys.clone());
    let scale_out = state.settings.enable_scale_out;
    let kobold = state.settings.launch_kobold_api;
    let pooling_routes = state
        .embedder
        .as_deref()
        .map(pooling::PoolingRoutes::for_model)
        .unwrap_or_default();
    let (mut app, doc) =
        role_routes(state.settings.role, scale_out, kobold, pooling_routes).split_for_parts();
    if state.settings.role == Role::Full && !scale_out {
        app = scale_out_disabled(app);
    }
    let doc_json: Arc<str> = openapi::finish(doc)
        .to_json()
        .unwrap_or_else(|_| "{}".to_owned())
        .into();
    let app = if !docs {
        app
    } else {
        app.route(
            "/openapi.json",
            axum::routing::get(move || {
                let body = doc_json.to_string();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                }
            }),
        )
        .route("/docs", axum::routing::get(openapi::docs))
    };
    let metrics = state.metrics.clone();
    let echo_request_id = state.settings.enable_request_id_headers;
    app.fallback(route_not_found)
        .layer(middleware::from_fn(
            move |req: Request, next: Next| async move {
                // --enable-request-id-headers: echo X-Request-Id, or a fresh uuid4 hex (§1.5).
                let given = req.headers().get("x-request-id").cloned();
                let mut resp = next.run(req).await;
                if echo_request_id {
                    let value = given.or_else(|| {
                        axum::http::HeaderValue::from_str(
                            &uuid::Uuid::new_v4().simple().to_string(),
                        )
                        .ok()
                    });
                    if let Some(v) = value {
                        resp.headers_mut().insert("x-request-id", v);
                    }
                }
                resp
            },
        ))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let metrics = metrics.clone();
            async move {
                let method = crate::metrics::method_label(req.method());
                let handler = req
                    .extensions()
                    .get::<axum::extract::MatchedPath>()
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_else(|| "none".to_owned());
                let resp = next.run(req).await;
                metrics.observe_http(method, resp.status().as_u16(), &handler);
                resp
            }
        }))
        .layer(middleware::from_fn_with_state(keys, require_api_key))
        .layer(middleware::from_fn(
            move |mut req: Request, next: Next| async move {
                req.extensions_mut().insert(limit);
                let resp: Response = next.run(req).await;
                resp
            },
        ))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request as HttpRequest, StatusCode};
    use tower::ServiceExt;

    /// A small sized body runs on the calling worker; an unsized or large one on another
    /// (blocking-pool) thread; a panic inline is a 500, not a dropped connection.
    #[tokio::test]
    async fn cpu_gate_runs_small_bodies_inline_and_large_ones_on_the_pool() {
        let gate = CpuGate::per_core();
        let here = std::thread::current().id();
        let on_thread = |len| {
            let gate = &gate;
            async move {
                gate.run(len, || {
                    Ok::<_, crate::error::ApiError>(std::thread::current().id())
                })
                .await
                .expect("runs")
            }
        };
        assert_eq!(on_thread(Some(1024)).await, here);
        assert_ne!(on_thread(None).await, here);
        assert_ne!(on_thread(Some(INLINE_BODY_LIMIT + 1)).await, here);
        let panicked = gate
            .run(Some(10), || -> Result<(), crate::error::ApiError> {
                panic!("boom")
            })
            .await
            .expect_err("a panic is an error");
        assert_eq!(panicked.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    fn state(keys: Vec<String>) -> AppState {
        AppState::new(ServerSettings {
            role: Role::Render,
            served_model_names: vec!["smollm2".into()],
            model_root: "/models/smollm2".into(),
            max_model_len: 8192,
            api_keys: keys,
            enable_request_id_headers: false,
            max_body_bytes: 1024,
            body_read_timeout: std::time::Duration::from_secs(5),
            enable_scale_out: false,
            skip_tokenizer_init: false,
            launch_kobold_api: false,
        })
    }

    async fn call(app: Router, path: &str, auth: Option<&str>) -> (StatusCode, String) {
        let mut req = HttpRequest::builder().uri(path);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = app
            .oneshot(req.body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn common_routes_and_fallback() {
        let app = router(state(vec![]));
        assert_eq!(
            call(app.clone(), "/health", None).await,
            (StatusCode::OK, String::new())
        );
        assert_eq!(
            call(app.clone(), "/version", None).await.1,
            r#"{"version":"0.33.0"}"#
        );
        let (status, body) = call(app.clone(), "/v1/models", None).await;
        assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["data"][0]["id"], "smollm2");
        assert_eq!(v["data"][0]["max_model_len"], 8192);
        assert_eq!(
            call(app, "/nope", None).await,
            (StatusCode::NOT_FOUND, r#"{"detail":"Not Found"}"#.into())
        );
    }

    #[tokio::test]
    async fn api_key_guards_only_the_openai_prefixes() {
        let app = router(state(vec!["sekret".into()]));
        assert_eq!(
            call(app.clone(), "/v1/models", None).await,
            (
                StatusCode::UNAUTHORIZED,
                r#"{"error":"Unauthorized"}"#.into()
            )
        );
        assert_eq!(
            call(app.clone(), "/v1/models", Some("bearer sekret"))
                .await
                .0,
            StatusCode::OK
        );
        assert_eq!(
            call(app.clone(), "/v1/models", Some("Bearer wrong"))
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(call(app.clone(), "/health", None).await.0, StatusCode::OK);
        assert_eq!(call(app, "/metrics", None).await.0, StatusCode::OK);
    }

    /// `(method, path)` pairs of an OpenAPI document.
    fn operations(doc: &serde_json::Value) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                out.push((method.to_uppercase(), path.clone()));
            }
        }
        out.sort();
        out
    }

    fn expected(list: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<_> = list
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn openapi_lists_exactly_each_roles_routes() {
        let common = [
            ("GET", "/health"),
            ("GET", "/ping"),
            ("POST", "/ping"),
            ("GET", "/version"),
            ("GET", "/v1/models"),
            ("GET", "/v1/models/{model}"),
            ("GET", "/metrics"),
        ];
        let render = [
            ("POST", "/v1/chat/completions/render"),
            ("POST", "/v1/completions/render"),
            ("POST", "/v1/chat/completions/derender"),
            ("POST", "/v1/completions/derender"),
            ("POST", "/tokenize"),
            ("POST", "/detokenize"),
        ];
        let engine = [
            ("POST", "/inference/v1/generate"),
            ("POST", "/inference/v1/abort_requests"),
        ];
        let openai = [
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/messages"),
        ];
        let count = [("POST", "/v1/messages/count_tokens")];
        let mut kobold = vec![
            ("POST", "/api/v1/generate"),
            ("POST", "/api/latest/generate"),
            ("POST", "/api/extra/generate/stream"),
            ("GET", "/api/extra/generate/check"),
            ("POST", "/api/extra/generate/check"),
            ("POST", "/api/extra/abort"),
            ("POST", "/api/extra/tokencount"),
            ("GET", "/api/extra/true_max_context_length"),
            ("GET", "/api/extra/version"),
        ];
        for v in ["v1", "latest"] {
            for p in [
                "info/version",
                "model",
                "config/max_length",
                "config/max_context_length",
                "config/soft_prompts_list",
                "config/soft_prompt",
            ] {
                kobold.push(("GET", Box::leak(format!("/api/{v}/{p}").into_boxed_str())));
            }
        }
        let full = [
            &common[..],
            &render[..],
            &engine[..],
            &openai[..],
            &count[..],
            // Generate servers score with the model's own next-token probabilities.
            &[("POST", "/generative_scoring")][..],
        ]
        .concat();
        // (role, --launch-kobold-api, the (method, path) pairs it documents)
        type Case<'a> = (Role, bool, Vec<(&'a str, &'a str)>);
        let audio = [
            ("POST", "/v1/audio/transcriptions"),
            ("POST", "/v1/audio/translations"),
        ];
        let cases: [Case<'_>; 5] = [
            (Role::Speech, false, [&common[..], &audio[..]].concat()),
            (
                Role::Render,
                false,
                [&common[..], &render[..], &count[..]].concat(),
            ),
            (
                Role::TokensOnly,
                false,
                [&common[..], &engine[..], &[("POST", "/abort_requests")][..]].concat(),
            ),
            (Role::Full, false, full.clone()),
            (Role::Full, true, [&full[..], &kobold[..]].concat()),
        ];
        for (role, with_kobold, want) in cases {
            let mut st = state(vec![]);
            Arc::make_mut(&mut st.settings).role = role;
            Arc::make_mut(&mut st.settings).enable_scale_out = true;
            Arc::make_mut(&mut st.settings).launch_kobold_api = with_kobold;
            let app = router(st);
            let (status, body) = call(app.clone(), "/openapi.json", None).await;
            assert_eq!(status, StatusCode::OK);
            let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
            assert_eq!(
                doc["openapi"].as_str().map(|v| v.starts_with("3.")),
                Some(true)
            );
            let ops = operations(&doc);
            assert_eq!(ops, expected(&want), "{role:?}");
            // Every documented operation is really mounted: a method no route uses gets 405,
            // an unmounted path the 404 fallback.
            for (method, path) in &ops {
                let other = "PATCH";
                let req = HttpRequest::builder()
                    .method(other)
                    .uri(path.as_str())
                    .body(Body::empty())
                    .expect("request");
                let resp = app.clone().oneshot(req).await.expect("response");
                assert_eq!(
                    resp.status(),
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{role:?} {method} {path} is documented but not mounted"
                );
            }
            assert_eq!(
                doc["components"]["schemas"]["ErrorResponse"]["type"],
                "object"
            );
            assert_eq!(
                openapi_document_with(role, true, with_kobold)
                    .paths
                    .paths
                    .len(),
                doc["paths"].as_object().map_or(0, |p| p.len())
            );
            let (status, html) = call(app, "/docs", None).await;
            assert_eq!(status, StatusCode::OK);
            assert!(
                html.contains("/openapi.json") && html.contains("<html"),
                "{html}"
            );
        }
    }

    #[tokio::test]
    async fn integrated_server_refuses_scale_out_routes_unless_enabled() {
        let mut st = state(vec![]);
        Arc::make_mut(&mut st.settings).role = Role::Full;
        let app = router(st);
        let scale_out = [
            "/v1/chat/completions/render",
            "/v1/completions/render",
            "/v1/chat/completions/derender",
            "/v1/completions/derender",
            "/inference/v1/generate",
            "/inference/v1/abort_requests",
        ];
        let (_, body) = call(app.clone(), "/openapi.json", None).await;
        let doc: serde_json::Value = serde_json::from_str(&body).expect("openapi json");
        for path in scale_out {
            assert!(doc["paths"].get(path).is_none(), "{path} is documented");
            let req = HttpRequest::builder()
                .method("POST")
                .uri(path)
                .body(Body::from("{}"))
                .expect("request");
            let resp = app.clone().oneshot(req).await.expect("response");
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{path}");
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .expect("body");
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(v["error"]["type"], "PermissionDeniedError");
            assert_eq!(v["error"]["code"], 403);
            assert_eq!(
                v["error"]["message"],
                "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
            );
        }
        // The integrated server's own routes stay.
        for path in ["/v1/chat/completions", "/v1/completions", "/tokenize"] {
            assert!(doc["paths"].get(path).is_some(), "{path} is missing");
        }
    }

    #[tokio::test]
    async fn ping_and_model_card() {
        let app = router(state(vec![]));
        assert_eq!(call(app.clone(), "/ping", None).await.0, StatusCode::OK);
        let req = HttpRequest::builder()
            .method("POST")
            .uri("/ping")
            .body(Body::empty())
            .expect("request");
        assert_eq!(
            app.clone().oneshot(req).await.expect("response").status(),
            StatusCode::OK
        );
        let (status, body) = call(app.clone(), "/v1/models/smollm2", None).await;
        assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["id"], "smollm2");
        assert_eq!(v["object"], "model");
        let (status, body) = call(app, "/v1/models/other", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("The model `other` does not exist."), "{body}");
    }

    #[tokio::test]
    async fn health_reports_a_dead_engine() {
        let s = state(vec![]);
        s.health.mark_dead("engine step failed: boom");
        let (status, body) = call(router(s), "/health", None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("boom"));
    }
}

mod listen;
pub use listen::{default_max_connections, ListenConfig};

/// Bind and serve until SIGTERM/SIGINT, then drain gracefully (see [`listen::serve`]);
/// builds its own multi-threaded runtime.
pub fn run_blocking(
    state: AppState,
    host: &str,
    port: u16,
    cfg: ListenConfig,
) -> std::io::Result<()> {
    listen::raise_open_files_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let engine = state.engine.clone();
    let app = router(state);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, port)).await?;
        let addr = listener.local_addr()?;
        let max_connections = cfg.max_connections.unwrap_or_else(default_max_connections);
        tracing::info!(%addr, max_connections, "aphro listening");
        eprintln!("aphro listening on http://{addr}");
        listen::serve(
            listener,
            app,
            cfg,
            listen::termination_signal(),
            move || {
                // Aborted requests end their streams with `finish_reason: "abort"` and `[DONE]`.
                if let Some(engine) = engine {
                    engine.shutdown();
                }
            },
        )
        .await
    })?;
    eprintln!("aphro: stopped");
    Ok(())
}
