//! Trust primitives shared by the coordinator and the agent: node keys and signed HTTP requests,
//! replay protection, API keys, hardware fingerprints and signed usage records and attestations.
//!
//! This crate does no IO: no files, no network, no clock. Decisions that depend on time take
//! `now_ms` (milliseconds since the Unix epoch) as a parameter. The only ambient input is the
//! operating system's random source, used to make keys, nonces and API keys.
//!
//! # Signed requests
//!
//! Every request from an agent carries four headers ([`HEADER_NODE`], [`HEADER_TIMESTAMP`],
//! [`HEADER_NONCE`], [`HEADER_SIGNATURE`]). The signature is ed25519 over this UTF-8 string
//! (see [`canonical_request`]), lines joined by `\n`, no trailing newline:
//!
//! ```text
//! fallow-request-v1
//! {METHOD}            as sent, e.g. GET (case is kept: HTTP methods are case-sensitive)
//! {path_and_query}    the request target as sent, e.g. /v1/nodes/7/usage?since=5
//! {body_blake3_hex}   blake3 of the raw body bytes, 64 lowercase hex chars (the empty body too)
//! {timestamp_ms}      decimal, the value of x-fallow-timestamp
//! {nonce}             32 lowercase hex chars (16 random bytes), the value of x-fallow-nonce
//! {node_id}           decimal i64, the value of x-fallow-node
//! ```
//!
//! The coordinator must rebuild the string from the raw request target (with axum, `OriginalUri`,
//! not the path a nested router sees) and the raw body bytes, before any decoding.
//!
//! The coordinator's order of checks: parse the headers ([`SignedHeaders::from_headers`]), look up
//! the node's public key, [`verify_request`], and only then [`NonceCache::check_and_remember`], so
//! that unauthenticated requests can neither fill the cache nor burn a node's nonces.
//!
//! ```
//! use trust::{DEFAULT_MAX_SKEW_MS, NodeKey, NonceCache, SignedHeaders, parse_public_key, verify_request};
//!
//! // Agent: the key is made once; the public half is registered with the coordinator.
//! let key = NodeKey::generate();
//! let registered_public_hex = key.public_hex();
//! let (now_ms, node_id, body) = (1_750_000_000_000, 7, br#"{"free_gpus":4}"#);
//! let headers = key.sign_request_now(node_id, "POST", "/v1/nodes/7/heartbeat", body, now_ms);
//! let sent = headers.header_pairs();
//!
//! // Coordinator: parse, look up the key by node id, verify, then check for a replay.
//! let lookup = |name: &str| sent.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
//! let received = SignedHeaders::from_headers(lookup)?;
//! let public = parse_public_key(&registered_public_hex)?;
//! verify_request(&public, received.node_id, "POST", "/v1/nodes/7/heartbeat", body, &received, now_ms, DEFAULT_MAX_SKEW_MS)?;
//! let mut nonces = NonceCache::default();
//! nonces.check_and_remember(received.node_id, &received.nonce, received.timestamp_ms, now_ms)?;
//! assert_eq!(
//!     nonces.check_and_remember(received.node_id, &received.nonce, received.timestamp_ms, now_ms),
//!     Err(trust::TrustError::Replayed)
//! );
//! # Ok::<(), trust::TrustError>(())
//! ```
//!
//! # Signed records
//!
//! Usage records and attestations are signed over
//! `"fallow-record-v1\n{type_name}\n{node_id}\n" + serde_json(body)`; see [`sign_record`].
//!
//! # The trust policy
//!
//! [`rules`] is `docs/trust-policy.md` as code: reputation (a Beta posterior with time decay),
//! badges, canary findings, usage cross-checks, the test for dropped jobs and missed windows,
//! and the share of a bond each proven fraud slashes.
//!
//! # Errors and HTTP
//!
//! [`TrustError`] variants map to status codes at the API edge, for example: `BadKey` → 400;
//! `BadHeader`, `BadSignature`, `Stale`, `BadApiKey` → 401; `Replayed` → 409;
//! `NonceCacheFull` → 503 (retry later with a new nonce).

mod api_key;
pub mod canary;
mod error;
mod fingerprint;
pub mod matmul;
mod nonce;
mod record;
mod request;
pub mod rules;

pub use api_key::{
    API_KEY_LENGTH, API_KEY_PREFIX, NewApiKey, generate_api_key, hash_secret, parse_api_key, verify_secret,
};
pub use error::TrustError;
pub use fingerprint::{GpuIdentity, fingerprint};
pub use nonce::{NONCES_MAX, NONCES_PER_NODE_MAX, NonceCache};
pub use record::{Attestation, RecordBody, SignedRecord, UsageRecord, record_signed_bytes, sign_record, verify_record};
pub use request::{
    DEFAULT_MAX_SKEW_MS, HEADER_NODE, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, NodeKey, SignatureCheck,
    SignedHeaders, body_digest_hex, canonical_request, new_nonce, parse_public_key, prepare_request, public_key_hex,
    verify_checks, verify_request,
};

// Re-exported so that callers can name the key type without depending on ed25519-dalek directly
// (and so cannot drift to another major version of it).
pub use ed25519_dalek::VerifyingKey;

/// `N` bytes from the operating system's random source.
///
/// # Panics
///
/// If the operating system cannot provide randomness. Keys and nonces made without it would be
/// guessable, so there is no safe fallback; a machine in that state cannot run Fallow.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    bytes
}
