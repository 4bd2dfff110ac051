//! Who is asking. Every route takes its user from [`Caller`], so `http.identity`'s rules
//! are applied once and the same way everywhere: a route cannot read a user from a source
//! the operator did not make authoritative.

use axum::extract::{FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::state::{header, AppState};
use crate::config::IdentityMode;
use crate::keys::{self, MAX_USER_BYTES};

/// What the bearer token proved, set by [`authorize`] for the routes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Credential {
    /// No token is configured and identity is not by key: loopback, trusted callers.
    Open,
    /// The service token: a backend, under `request`'s rules (or `header`'s).
    Service,
    /// A user's own key: that user, whatever else the request says.
    UserKey(String),
}

/// `Authorization: Bearer …` on every route: the service token (`http.token`) when one is
/// configured, or with `http.identity = "key"` a user's key. Sets the [`Credential`].
pub(super) async fn authorize(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let http = &state.settings.http;
    let token = http.token.as_deref().filter(|t| !t.is_empty());
    let given = header(request.headers(), "authorization");
    let given = given.as_deref().and_then(|v| v.strip_prefix("Bearer "));
    // Constant time, so the comparison does not reveal how much of a guess was right.
    let is_token = |g: &str| token.is_some_and(|t| bool::from(g.as_bytes().ct_eq(t.as_bytes())));
    let credential = match given {
        Some(g) if is_token(g) => Credential::Service,
        Some(g) if http.identity == IdentityMode::Key => {
            match keys::user_of(&state.pool, g).await {
                Ok(Some(user)) => Credential::UserKey(user),
                Ok(None) => return unauthorized(),
                Err(e) => return ApiError::from(e).into_response(),
            }
        }
        _ if token.is_some() || http.identity == IdentityMode::Key => return unauthorized(),
        _ => Credential::Open,
    };
    request.extensions_mut().insert(credential);
    next.run(request).await
}

fn unauthorized() -> Response {
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "missing or wrong bearer token (Authorization: Bearer <KVMEM_HTTP_TOKEN or a user's key>)",
    )
    .into_response();
    response.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    response
}

#[derive(Deserialize)]
struct UserQuery {
    #[serde(default)]
    user: Option<String>,
}

/// The caller as the request's parts say: the credential, the configured user header and
/// the query's `user`. A route with a body passes the body's `user` to [`Caller::user`].
#[derive(Debug)]
pub(super) struct Caller {
    mode: IdentityMode,
    credential: Credential,
    header_name: String,
    header: Option<String>,
    query: Option<String>,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let http = &state.settings.http;
        // A query that does not parse is the route's own 400 to give; here only `user` counts.
        let query = Query::<UserQuery>::try_from_uri(&parts.uri)
            .ok()
            .and_then(|q| q.0.user);
        Ok(Caller {
            mode: http.identity,
            credential: parts
                .extensions
                .get::<Credential>()
                .cloned()
                .unwrap_or(Credential::Open),
            header_name: http.user_header.clone(),
            header: header(&parts.headers, &http.user_header),
            query,
        })
    }
}

impl Caller {
    /// The caller's user; a route that cannot serve without one.
    pub(super) fn user(&self, body: Option<&str>) -> Result<String, ApiError> {
        self.maybe_user(body)?.ok_or_else(|| {
            let (status, kind) = match self.mode {
                IdentityMode::Request => (StatusCode::BAD_REQUEST, "invalid_request_error"),
                _ => (StatusCode::UNAUTHORIZED, "authentication_error"),
            };
            ApiError::new(status, kind, format!("missing user id: {}", self.sources()))
        })
    }

    /// The caller's user, if the request has one; every source it has must agree.
    pub(super) fn maybe_user(&self, body: Option<&str>) -> Result<Option<String>, ApiError> {
        let given = |v: Option<&str>| v.filter(|u| !u.trim().is_empty()).map(str::to_string);
        let claims = [
            ("the body's `user`", given(body)),
            ("the query's `user`", given(self.query.as_deref())),
            (self.header_name.as_str(), given(self.header.as_deref())),
        ];
        let user = match (&self.credential, self.mode) {
            // A key is its user: any other claim is another user's, refused.
            (Credential::UserKey(owner), _) => Some(self.only(owner, &claims, "this API key")?),
            (_, IdentityMode::Header) => match &claims[2].1 {
                Some(h) => Some(self.only(h, &claims, &format!("header {}", self.header_name))?),
                None => match claims.iter().find_map(|c| c.1.as_ref()) {
                    Some(_) => {
                        return Err(forbidden(format!(
                            "the user comes only from header {} (http.identity = \"header\")",
                            self.header_name
                        )))
                    }
                    None => None,
                },
            },
            // A backend's sources, in order: body, query, header; two that disagree are a
            // caller's bug (or a claim to be someone else), never resolved by picking one.
            _ => {
                let mut present = claims
                    .iter()
                    .filter_map(|(from, u)| Some((*from, u.as_deref()?)));
                let first = present.next();
                if let Some((a, ua)) = first {
                    if let Some((b, _)) = present.find(|(_, u)| *u != ua) {
                        return Err(ApiError::bad_request(format!(
                            "{a} and {b} name different users; give one, or the same in each"
                        )));
                    }
                }
                first.map(|(_, u)| u.to_string())
            }
        };
        match user {
            Some(u) => Ok(Some(valid(u)?)),
            None => Ok(None),
        }
    }

    /// `owner`, when every claim the request makes is `owner`; else 403.
    fn only(
        &self,
        owner: &str,
        claims: &[(&str, Option<String>)],
        from: &str,
    ) -> Result<String, ApiError> {
        match claims
            .iter()
            .find(|(_, u)| u.as_deref().is_some_and(|u| u != owner))
        {
            Some((claim, _)) => Err(forbidden(format!(
                "{claim} names another user than {from}; a caller acts only as itself"
            ))),
            None => Ok(owner.to_string()),
        }
    }

    /// Where this server takes the user from, for an error naming what was missing.
    fn sources(&self) -> String {
        match self.mode {
            IdentityMode::Request => {
                format!("give `user` (body or query) or header {}", self.header_name)
            }
            IdentityMode::Header => format!("header {} is required", self.header_name),
            IdentityMode::Key => {
                "send a user's key as the bearer token, or the service token with `user`".into()
            }
        }
    }

    /// Whether the caller may read operator routes (`/metrics`): anyone but a user's key.
    pub(super) fn is_operator(&self) -> bool {
        !matches!(self.credential, Credential::UserKey(_))
    }
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "permission_error", message)
}

/// A user id the queue's indexes and the erase can hold: bounded, printable.
fn valid(user: String) -> Result<String, ApiError> {
    if user.len() > MAX_USER_BYTES {
        return Err(ApiError::bad_request(format!(
            "user id is {} bytes; the limit is {MAX_USER_BYTES}",
            user.len()
        )));
    }
    if user.chars().any(char::is_control) {
        return Err(ApiError::bad_request("user id holds a control character"));
    }
    Ok(user)
}
