//! The dashboard: HTML pages under `/dashboard`, drawn on the server (SVG charts included) from
//! the same reads and ownership checks as the `/v1` API, with no script to build or run.
//!
//! The market page is public, like `/v1/market`. The tenant, provider and job pages need an API
//! key, pasted once into the sign-in form and kept in an HttpOnly, SameSite=Strict cookie; each
//! shows only the caller's own jobs, nodes and money, and someone else's job answers 404.

mod chart;
mod html;
mod job;
mod market;
mod provider;
mod tenant;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use store::Role;

use crate::error::ApiError;
use crate::state::{AppState, Caller};
use html::escape;

/// The cookie that holds the signed-in party's API key.
const KEY_COOKIE: &str = "fallow_key";
/// How long a sign-in lasts in the browser (the key itself may be revoked sooner: every page
/// checks it as the API does).
const SESSION_MAX_AGE_S: u32 = 12 * 3600;
/// Pages reload themselves at most this often when asked to (`?refresh_s=N`).
const REFRESH_S_MIN: u32 = 5;
/// How far back the pages look by default, and at most (hours).
const WINDOW_HOURS_DEFAULT: i64 = 24;
const WINDOW_HOURS_MAX: i64 = 24 * 90;
/// The longest API key the sign-in form takes (keys are 84 characters).
const KEY_CHARS_MAX: usize = 256;

const STYLE: &str = include_str!("style.css");

/// The dashboard's routes, merged into the coordinator's router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/dashboard", get(market::page))
        .route("/dashboard/login", get(login_form).post(login))
        .route("/dashboard/logout", get(logout).post(logout))
        .route("/dashboard/tenant", get(tenant::page))
        .route("/dashboard/provider", get(provider::page))
        .route("/dashboard/jobs/{id}", get(job::page))
        .route("/dashboard/style.css", get(style))
}

/// Who is signed in: the API key's account, checked as the API checks it.
#[derive(Clone, Debug)]
pub struct Session {
    pub caller: Caller,
    pub name: String,
}

/// The API key in the request's cookie, if any.
fn cookie_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == KEY_COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

async fn session_of(state: &AppState, headers: &HeaderMap) -> Result<Option<Session>, ApiError> {
    let Some(key) = cookie_key(headers) else {
        return Ok(None);
    };
    let caller = match state.authenticate(&key).await {
        Ok(caller) => caller,
        // A revoked or mistyped key: signed out, as with no cookie.
        Err(ApiError::Unauthorized(_)) => return Ok(None),
        Err(error) => return Err(error),
    };
    let name = state
        .store
        .account(caller.account_id)
        .await?
        .map_or_else(|| format!("account {}", caller.account_id), |account| account.name);
    Ok(Some(Session { caller, name }))
}

/// A signed-in party; anyone else is sent to the sign-in form.
impl FromRequestParts<Arc<AppState>> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Session, Response> {
        match session_of(state, &parts.headers).await {
            Ok(Some(session)) => Ok(session),
            Ok(None) => Err(see_other("/dashboard/login")),
            Err(error) => Err(PageError::from(error).into_response()),
        }
    }
}

/// The signed-in party if there is one (the public market page shows who is signed in).
pub struct MaybeSession(pub Option<Session>);

impl FromRequestParts<Arc<AppState>> for MaybeSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<MaybeSession, Response> {
        session_of(state, &parts.headers)
            .await
            .map(MaybeSession)
            .map_err(|error| PageError::from(error).into_response())
    }
}

impl Session {
    /// Refuses a page meant for another role, saying which key it needs.
    fn require(&self, role: Role) -> Result<(), PageError> {
        if self.caller.role == role {
            return Ok(());
        }
        Err(PageError {
            status: StatusCode::FORBIDDEN,
            message: format!(
                "This page is for {role} keys; you are signed in with a {} key. Sign out and sign in with a {role} key.",
                self.caller.role
            ),
        })
    }
}

/// What the pages take from the query string; anything unreadable counts as absent.
#[derive(Deserialize, Default)]
pub struct PageQuery {
    /// Reload the page every this many seconds.
    refresh_s: Option<u32>,
    /// How far back the charts and sums look.
    hours: Option<i64>,
    /// The job page's logs: chunks after this one.
    after: Option<i64>,
}

impl PageQuery {
    fn window_hours(&self) -> i64 {
        self.hours.unwrap_or(WINDOW_HOURS_DEFAULT).clamp(1, WINDOW_HOURS_MAX)
    }
}

/// A page that could not be served, as HTML: the API's status and message.
pub struct PageError {
    status: StatusCode,
    message: String,
}

impl From<ApiError> for PageError {
    fn from(error: ApiError) -> PageError {
        let message = error.to_string();
        // The API's status for the error (and its log line, for a server error).
        let status = error.into_response().status();
        PageError { status, message }
    }
}

impl From<store::StoreError> for PageError {
    fn from(error: store::StoreError) -> PageError {
        PageError::from(ApiError::from(error))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error");
        let body = format!(
            "<h1>{}</h1><p class=\"error\">{}</p>",
            escape(title),
            escape(&self.message)
        );
        let mut response = render(title, None, &body, None);
        *response.status_mut() = self.status;
        response
    }
}

fn see_other(location: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// A whole page: the shared header (with who is signed in) around `body`, which must already be
/// HTML with every outside string escaped.
pub fn render(title: &str, session: Option<&Session>, body: &str, refresh_s: Option<u32>) -> Response {
    let refresh = refresh_s
        .map(|seconds| {
            format!(
                "<meta http-equiv=\"refresh\" content=\"{}\">",
                seconds.max(REFRESH_S_MIN)
            )
        })
        .unwrap_or_default();
    let who = match session {
        Some(session) => format!(
            "<span class=\"who\">signed in as <b>{}</b> ({}) · <a href=\"/dashboard/logout\">sign out</a></span>",
            escape(&session.name),
            session.caller.role
        ),
        None => "<span class=\"who\"><a href=\"/dashboard/login\">sign in</a></span>".to_string(),
    };
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{refresh}\
         <title>{title} · Fallow</title><link rel=\"stylesheet\" href=\"/dashboard/style.css\"></head>\
         <body><header><a class=\"brand\" href=\"/dashboard\">Fallow</a><nav>\
         <a href=\"/dashboard\">Market</a><a href=\"/dashboard/tenant\">Tenant</a>\
         <a href=\"/dashboard/provider\">Provider</a></nav>{who}</header><main>{body}</main>\
         <footer>Times are UTC. Prices are per GPU-hour. <a href=\"/v1/explorer\">API</a></footer></body></html>",
        title = escape(title)
    );
    let mut response = html.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // No script runs on these pages, so none may: a string that escaped escaping still cannot.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Not `no-referrer`: with it, browsers send `Origin: null` with the sign-in form, and
    // `same_origin` could not tell this site's page from a sandboxed one elsewhere.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLE,
    )
        .into_response()
}

fn login_page(message: Option<&str>) -> String {
    let message = message
        .map(|text| format!("<p class=\"error\">{}</p>", escape(text)))
        .unwrap_or_default();
    format!(
        "<h1>Sign in</h1>{message}<form class=\"login\" method=\"post\" action=\"/dashboard/login\">\
         <label for=\"key\">API key</label>\
         <input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"off\" required \
         placeholder=\"fallow_…\" maxlength=\"{KEY_CHARS_MAX}\">\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"note\">Tenants see their jobs and spend, providers their nodes and earnings. The key is kept \
         in a cookie only this site's pages can send, and scripts cannot read.</p>"
    )
}

async fn login_form(MaybeSession(session): MaybeSession) -> Response {
    render("Sign in", session.as_ref(), &login_page(None), None)
}

#[derive(Deserialize)]
pub struct LoginForm {
    key: String,
}

/// Whether a form post came from one of this site's pages: browsers name the page's origin, and
/// a post from another site is refused (so no one signs a visitor in with another key).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|value| value.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|value| value.to_str().ok());
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    origin_host.is_some() && origin_host == host
}

async fn login(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    form: Result<axum::Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let refuse = |status: StatusCode, message: &str| {
        let mut response = render("Sign in", None, &login_page(Some(message)), None);
        *response.status_mut() = status;
        response
    };
    if !same_origin(&headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "This form may only be sent from this site's own page.",
        );
    }
    let Ok(axum::Form(form)) = form else {
        return refuse(StatusCode::BAD_REQUEST, "Paste an API key into the form.");
    };
    let key = form.key.trim();
    if key.is_empty() || key.len() > KEY_CHARS_MAX {
        return refuse(StatusCode::BAD_REQUEST, "Paste an API key into the form.");
    }
    let caller = match state.authenticate(key).await {
        Ok(caller) => caller,
        Err(error @ ApiError::Unauthorized(_)) => {
            return refuse(StatusCode::UNAUTHORIZED, &format!("That key does not sign in: {error}"));
        }
        Err(error) => return PageError::from(error).into_response(),
    };
    let home = match caller.role {
        Role::Tenant => "/dashboard/tenant",
        Role::Provider => "/dashboard/provider",
        Role::Admin => "/dashboard",
    };
    // A key that authenticated is `fallow_<hex>_<hex>`: nothing in it needs quoting.
    let cookie = format!("{KEY_COOKIE}={key}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={SESSION_MAX_AGE_S}");
    match HeaderValue::from_str(&cookie) {
        Ok(cookie) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, HeaderValue::from_static(home)),
                (header::SET_COOKIE, cookie),
            ],
        )
            .into_response(),
        Err(_) => refuse(StatusCode::BAD_REQUEST, "That key cannot be kept in a cookie."),
    }
}

async fn logout() -> Response {
    let cookie = format!("{KEY_COOKIE}=; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=0");
    let mut response = see_other("/dashboard");
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_comes_from_its_cookie_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(cookie_key(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("other=1; fallow_key=fallow_ab_cd; x=2"),
        );
        assert_eq!(cookie_key(&headers).as_deref(), Some("fallow_ab_cd"));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("fallow_key=; not_fallow_key=zz"),
        );
        assert_eq!(cookie_key(&headers), None);
    }

    #[test]
    fn posts_from_other_sites_are_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7070"));
        assert!(same_origin(&headers), "no Origin: not a cross-site browser post");
        headers.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:7070"));
        assert!(same_origin(&headers));
        headers.insert(header::ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&headers));
    }

    #[tokio::test]
    async fn error_pages_keep_the_apis_status_and_escape_their_message() {
        let response = PageError::from(ApiError::NotFound("job <b>7</b> not found".into())).into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let policy = response.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(policy.starts_with("default-src 'none'"), "{policy}");
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            body.contains("job &lt;b&gt;7&lt;/b&gt; not found") && !body.contains("<b>7"),
            "{body}"
        );
    }
}
