//! The API's error body and status mapping: every failure reaches the client as JSON with
//! a clear message, never a dropped connection, and says whether a retry is safe.

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::queue::QueueError;

/// An error response in OpenAI's shape.
pub(super) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    pub(super) extra: Value,
    /// `x-should-retry`, which the OpenAI SDKs obey.
    retry: bool,
}

impl ApiError {
    pub(super) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: Value::Null,
            // A server error is safe to retry: the retry is the same turn (http::chat), and
            // a request that failed before queueing one queues it. Bad input stays bad.
            retry: status.is_server_error() && kind != "timeout",
        }
    }

    /// An answer that a retry would only repeat: the turn's own end (it died), which a
    /// retry of the request maps to again.
    pub(super) fn final_answer(mut self) -> ApiError {
        self.retry = false;
        self
    }

    /// The answer of a scripted test fault (`KVMEM_TEST_HTTP_FAULTS`).
    pub(super) fn fault(status: u16, point: &str) -> ApiError {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError::new(
            status,
            "server_error",
            format!("test fault: KVMEM_TEST_HTTP_FAULTS failed this request at {point}"),
        )
    }

    pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// The `error` object of the body: message, type, and what `extra` adds.
    pub(super) fn body(&self) -> Value {
        let mut error = json!({ "message": self.message, "type": self.kind });
        if let Value::Object(extra) = &self.extra {
            error.as_object_mut().expect("object").extend(extra.clone());
        }
        error
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.body() }))).into_response();
        // The OpenAI SDKs retry 408, 409, 429 and every 5xx unless told otherwise. A
        // timed-out turn stays queued and goes on: a retry would be the same turn, but the
        // wait was the client's to choose, so the SDK is told not to wait again by itself.
        let retry = if self.retry { "true" } else { "false" };
        response.headers_mut().insert(
            HeaderName::from_static("x-should-retry"),
            HeaderValue::from_static(retry),
        );
        response
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> ApiError {
        if let QueueError::Invalid(m) = e {
            return ApiError::bad_request(m);
        }
        if let QueueError::Db(sqlx::Error::Database(d)) = &e {
            match d.code().as_deref() {
                Some("22023") | Some("22021") | Some("22P05") => {
                    return ApiError::bad_request(d.message())
                }
                Some("P0002") => {
                    return ApiError::new(StatusCode::NOT_FOUND, "not_found_error", d.message())
                }
                _ => {}
            }
        }
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::from(QueueError::Db(e))
    }
}

impl From<super::memory_api::HttpError> for ApiError {
    fn from(e: super::memory_api::HttpError) -> ApiError {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let kind = match e {
            super::memory_api::HttpError::BadRequest(_) => "invalid_request_error",
            super::memory_api::HttpError::NotFound(_) => "not_found_error",
            super::memory_api::HttpError::Internal(_) => "server_error",
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<crate::summary::SummaryError> for ApiError {
    fn from(e: crate::summary::SummaryError) -> ApiError {
        use crate::summary::SummaryError;
        match e {
            SummaryError::Invalid(m) => ApiError::bad_request(m),
            SummaryError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, "not_found_error", m),
            other => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                other.to_string(),
            ),
        }
    }
}

impl From<crate::keys::KeyError> for ApiError {
    fn from(e: crate::keys::KeyError) -> ApiError {
        match e {
            crate::keys::KeyError::Invalid(m) => ApiError::bad_request(m),
            crate::keys::KeyError::Db(e) => ApiError::from(e),
        }
    }
}
