//! The one error type of this crate, with cases a caller maps to distinct HTTP answers.

/// Why a key, request, record or API key was refused.
///
/// Messages never contain secrets (API key secrets, node private keys), because callers log them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// The signature does not match the request or record and the registered public key.
    #[error("signature does not match the request and the node's registered public key")]
    BadSignature,
    /// The request's timestamp is too far from the coordinator's clock. `skew_ms` is the request
    /// time minus the coordinator's time: positive means the request claims to be from the future.
    #[error("request timestamp is {skew_ms} ms away from the coordinator's clock; check the node's clock (NTP)")]
    Stale { skew_ms: i64 },
    /// This node already used this nonce within the replay window.
    #[error("nonce already used by this node; each request needs a fresh nonce")]
    Replayed,
    /// A signing header is missing or malformed.
    #[error("header {name}: {reason}")]
    BadHeader { name: &'static str, reason: String },
    /// A node key (public or secret) is malformed or unusable.
    #[error("bad node key: {0}")]
    BadKey(String),
    /// An API key is malformed or does not match.
    #[error("bad API key: {0}")]
    BadApiKey(String),
    /// The replay cache is at its limit. Forgetting unexpired nonces would allow replays, so new
    /// requests are refused until old entries expire.
    #[error("too many recent requests to check for replays; retry in a few seconds")]
    NonceCacheFull,
}
