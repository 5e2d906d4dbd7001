//! Node keys and signed HTTP requests: the canonical string, signing and verification.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::TrustError;

/// The node's id as the coordinator knows it, decimal i64.
pub const HEADER_NODE: &str = "x-fallow-node";
/// Milliseconds since the Unix epoch, decimal.
pub const HEADER_TIMESTAMP: &str = "x-fallow-timestamp";
/// 16 random bytes as 32 lowercase hex chars.
pub const HEADER_NONCE: &str = "x-fallow-nonce";
/// The 64-byte ed25519 signature as 128 hex chars.
pub const HEADER_SIGNATURE: &str = "x-fallow-signature";

/// How far a request's timestamp may be from the coordinator's clock, either way. Wide enough
/// for NTP-synced hosts and slow uploads, narrow enough to keep the replay cache small.
pub const DEFAULT_MAX_SKEW_MS: i64 = 30_000;

const REQUEST_DOMAIN: &str = "fallow-request-v1";
const NONCE_BYTES: usize = 16;
const NONCE_HEX_LENGTH: usize = 2 * NONCE_BYTES;
const SECRET_KEY_HEX_LENGTH: usize = 2 * ed25519_dalek::SECRET_KEY_LENGTH;
const PUBLIC_KEY_HEX_LENGTH: usize = 2 * ed25519_dalek::PUBLIC_KEY_LENGTH;
const SIGNATURE_HEX_LENGTH: usize = 2 * ed25519_dalek::SIGNATURE_LENGTH;

/// A node's ed25519 signing key. Its `Debug` shows only the public half.
#[derive(Debug)]
pub struct NodeKey {
    signing: SigningKey,
}

impl NodeKey {
    /// A new key from the operating system's random source.
    ///
    /// # Panics
    ///
    /// If the operating system has no random source (no safe key can be made then).
    pub fn generate() -> NodeKey {
        // From raw bytes rather than `SigningKey::generate(rng)`, so this crate does not couple
        // to dalek's rand_core version.
        NodeKey {
            signing: SigningKey::from_bytes(&crate::random_bytes()),
        }
    }

    /// The key from its 32-byte secret as 64 hex chars (as written by [`NodeKey::to_hex`]).
    pub fn from_hex(secret_hex: &str) -> Result<NodeKey, TrustError> {
        let secret_hex = secret_hex.trim();
        if secret_hex.len() != SECRET_KEY_HEX_LENGTH {
            return Err(TrustError::BadKey(format!(
                "a node secret key is {SECRET_KEY_HEX_LENGTH} hex characters, got {}",
                secret_hex.len()
            )));
        }
        let mut secret = [0u8; ed25519_dalek::SECRET_KEY_LENGTH];
        // The message names no character: it would be part of the secret.
        hex::decode_to_slice(secret_hex, &mut secret)
            .map_err(|_| TrustError::BadKey("a node secret key must contain only hex characters".to_owned()))?;
        Ok(NodeKey {
            signing: SigningKey::from_bytes(&secret),
        })
    }

    /// The 32-byte secret as 64 lowercase hex chars. Secret: store it with owner-only permissions.
    pub fn to_hex(&self) -> String {
        hex::encode(self.signing.as_bytes())
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    /// The public key as 64 lowercase hex chars, as registered with the coordinator.
    pub fn public_hex(&self) -> String {
        hex::encode(self.signing.verifying_key().as_bytes())
    }

    /// The headers for one request. `nonce` must be fresh (see [`new_nonce`]) and
    /// `path_and_query` exactly the request target that will be sent.
    pub fn sign_request(
        &self,
        node_id: i64,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        timestamp_ms: i64,
        nonce: &str,
    ) -> SignedHeaders {
        let message = canonical_request(node_id, method, path_and_query, body, timestamp_ms, nonce);
        let signature = self.signing.sign(message.as_bytes());
        SignedHeaders {
            node_id,
            timestamp_ms,
            nonce: nonce.to_owned(),
            signature_hex: hex::encode(signature.to_bytes()),
        }
    }

    /// [`NodeKey::sign_request`] with a fresh nonce. The timestamp stays a parameter so that the
    /// caller owns the clock.
    pub fn sign_request_now(
        &self,
        node_id: i64,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        timestamp_ms: i64,
    ) -> SignedHeaders {
        self.sign_request(node_id, method, path_and_query, body, timestamp_ms, &new_nonce())
    }

    pub(crate) fn sign_bytes(&self, message: &[u8]) -> Signature {
        self.signing.sign(message)
    }
}

/// A public key as 64 lowercase hex chars, as registered with the coordinator.
pub fn public_key_hex(key: &VerifyingKey) -> String {
    hex::encode(key.as_bytes())
}

/// A fresh request nonce: 16 random bytes as 32 lowercase hex chars.
pub fn new_nonce() -> String {
    hex::encode(crate::random_bytes::<NONCE_BYTES>())
}

/// The values of the four signing headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders {
    pub node_id: i64,
    pub timestamp_ms: i64,
    /// Kept as sent; [`verify_request`] checks its format.
    pub nonce: String,
    /// Kept as sent; [`verify_request`] checks its format.
    pub signature_hex: String,
}

impl SignedHeaders {
    /// (header name, value) pairs to attach to the request.
    pub fn header_pairs(&self) -> [(&'static str, String); 4] {
        [
            (HEADER_NODE, self.node_id.to_string()),
            (HEADER_TIMESTAMP, self.timestamp_ms.to_string()),
            (HEADER_NONCE, self.nonce.clone()),
            (HEADER_SIGNATURE, self.signature_hex.clone()),
        ]
    }

    /// Reads the four headers through `get` (header name → value, `None` when absent or not
    /// text). Only presence and the two numbers are checked here; [`verify_request`] does the rest.
    pub fn from_headers<'a>(mut get: impl FnMut(&'static str) -> Option<&'a str>) -> Result<SignedHeaders, TrustError> {
        let mut required = |name: &'static str| {
            get(name).ok_or_else(|| TrustError::BadHeader {
                name,
                reason: "missing".to_owned(),
            })
        };
        let node = required(HEADER_NODE)?;
        let timestamp = required(HEADER_TIMESTAMP)?;
        let nonce = required(HEADER_NONCE)?;
        let signature = required(HEADER_SIGNATURE)?;
        Ok(SignedHeaders {
            node_id: parse_decimal(HEADER_NODE, node, "a node id")?,
            timestamp_ms: parse_decimal(HEADER_TIMESTAMP, timestamp, "milliseconds since the Unix epoch")?,
            nonce: nonce.to_owned(),
            signature_hex: signature.to_owned(),
        })
    }
}

fn parse_decimal(name: &'static str, value: &str, what: &str) -> Result<i64, TrustError> {
    // The signed string formats the parsed number, not this text, so a lenient spelling ("+7")
    // cannot change what the signature covers.
    value.trim().parse().map_err(|_| TrustError::BadHeader {
        name,
        reason: format!("must be a decimal i64 ({what})"),
    })
}

/// blake3 of the raw body, 64 lowercase hex chars.
pub fn body_digest_hex(body: &[u8]) -> String {
    blake3::hash(body).to_hex().to_string()
}

/// The string a request signature covers; the format is in the crate docs.
pub fn canonical_request(
    node_id: i64,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    timestamp_ms: i64,
    nonce: &str,
) -> String {
    format!(
        "{REQUEST_DOMAIN}\n{method}\n{path_and_query}\n{}\n{timestamp_ms}\n{nonce}\n{node_id}",
        body_digest_hex(body)
    )
}

/// A registered public key from 64 hex chars. Refuses points that are not on the curve and weak
/// (small-order) keys, for which one signature verifies for almost any message.
pub fn parse_public_key(public_hex: &str) -> Result<VerifyingKey, TrustError> {
    let public_hex = public_hex.trim();
    if public_hex.len() != PUBLIC_KEY_HEX_LENGTH {
        return Err(TrustError::BadKey(format!(
            "a node public key is {PUBLIC_KEY_HEX_LENGTH} hex characters, got {}",
            public_hex.len()
        )));
    }
    let mut bytes = [0u8; ed25519_dalek::PUBLIC_KEY_LENGTH];
    hex::decode_to_slice(public_hex, &mut bytes)
        .map_err(|error| TrustError::BadKey(format!("a node public key must be hex: {error}")))?;
    let key = VerifyingKey::from_bytes(&bytes)
        .map_err(|_| TrustError::BadKey("not a valid ed25519 public key (not a curve point)".to_owned()))?;
    if key.is_weak() {
        return Err(TrustError::BadKey(
            "weak ed25519 public key (small order); make a new key".to_owned(),
        ));
    }
    Ok(key)
}

/// Checks one request's signature and freshness. Replays are checked afterwards, by
/// [`crate::NonceCache::check_and_remember`].
///
/// `node_id` is the node whose `public` key the caller looked up; it must equal the header's.
#[allow(clippy::too_many_arguments)] // each is one field of the signed string; a struct would only rename them
pub fn verify_request(
    public: &VerifyingKey,
    node_id: i64,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    headers: &SignedHeaders,
    now_ms: i64,
    max_skew_ms: i64,
) -> Result<(), TrustError> {
    prepare_request(
        public,
        node_id,
        method,
        path_and_query,
        body,
        headers,
        now_ms,
        max_skew_ms,
    )?
    .verify()
}

/// A request's signature, with every check but the curve operation done: verify it alone
/// ([`SignatureCheck::verify`]) or with others ([`verify_checks`]).
#[derive(Clone, Debug)]
pub struct SignatureCheck {
    key: VerifyingKey,
    message: String,
    signature: Signature,
}

impl SignatureCheck {
    /// Verifies the signature alone. `verify_strict` also refuses weak keys and non-canonical
    /// signatures, which plain `verify` lets through.
    pub fn verify(&self) -> Result<(), TrustError> {
        self.key
            .verify_strict(self.message.as_bytes(), &self.signature)
            .map_err(|_| TrustError::BadSignature)
    }
}

/// Verifies many signatures at once and says, in order, which are good. A batch costs about
/// half as much per signature as checking each alone (ed25519-dalek's `verify_batch`, one
/// multiscalar multiplication). A batch with a bad signature in it fails as a whole, so it is
/// split in halves until the bad ones stand alone, each then checked with `verify_strict`: a
/// bad signature costs its batch about log2(n) more batch checks, not n single ones.
///
/// What a batch accepts differs from `verify_strict` only for signatures whose `R` is a point of
/// small order: only the key's holder can make one (no forgery), and replays are refused by
/// nonce, never by the signature's bytes. Weak keys are refused at registration.
pub fn verify_checks(checks: &[SignatureCheck]) -> Vec<bool> {
    let mut good = vec![false; checks.len()];
    verify_range(checks, 0, &mut good);
    good
}

fn verify_range(checks: &[SignatureCheck], offset: usize, good: &mut [bool]) {
    match checks {
        [] => {}
        [one] => good[offset] = one.verify().is_ok(),
        _ => {
            let messages: Vec<&[u8]> = checks.iter().map(|check| check.message.as_bytes()).collect();
            let signatures: Vec<Signature> = checks.iter().map(|check| check.signature).collect();
            let keys: Vec<VerifyingKey> = checks.iter().map(|check| check.key).collect();
            if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok() {
                good[offset..offset + checks.len()].fill(true);
            } else {
                let half = checks.len() / 2;
                verify_range(&checks[..half], offset, good);
                verify_range(&checks[half..], offset + half, good);
            }
        }
    }
}

/// Every check of [`verify_request`] but the signature's curve operation, which the returned
/// [`SignatureCheck`] does.
#[allow(clippy::too_many_arguments)] // as verify_request
pub fn prepare_request(
    public: &VerifyingKey,
    node_id: i64,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    headers: &SignedHeaders,
    now_ms: i64,
    max_skew_ms: i64,
) -> Result<SignatureCheck, TrustError> {
    assert!(max_skew_ms >= 0, "max_skew_ms is a distance, got {max_skew_ms}");
    // Cheapest checks first; the signature costs a curve operation.
    if headers.node_id != node_id {
        return Err(TrustError::BadHeader {
            name: HEADER_NODE,
            reason: format!("names node {} but the key checked is node {node_id}'s", headers.node_id),
        });
    }
    // A newline would let two different (method, target) pairs give one signed string.
    if method.is_empty() || method.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(TrustError::BadHeader {
            name: ":method",
            reason: "empty or contains control characters".to_owned(),
        });
    }
    if path_and_query.bytes().any(|b| b.is_ascii_control()) {
        return Err(TrustError::BadHeader {
            name: ":path",
            reason: "contains control characters".to_owned(),
        });
    }
    check_nonce_format(&headers.nonce)?;
    let signature = parse_signature(&headers.signature_hex)?;
    // The timestamp comes from the network: saturate rather than overflow on extreme values.
    let skew_ms = headers.timestamp_ms.saturating_sub(now_ms);
    if skew_ms.unsigned_abs() > max_skew_ms.unsigned_abs() {
        return Err(TrustError::Stale { skew_ms });
    }
    let message = canonical_request(
        node_id,
        method,
        path_and_query,
        body,
        headers.timestamp_ms,
        &headers.nonce,
    );
    Ok(SignatureCheck {
        key: *public,
        message,
        signature,
    })
}

/// The nonce's 16 bytes, if it is exactly 32 lowercase hex chars. Lowercase only, so that one
/// nonce has one spelling.
pub(crate) fn check_nonce_format(nonce: &str) -> Result<[u8; NONCE_BYTES], TrustError> {
    let well_formed =
        nonce.len() == NONCE_HEX_LENGTH && nonce.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !well_formed {
        return Err(TrustError::BadHeader {
            name: HEADER_NONCE,
            reason: format!("must be {NONCE_HEX_LENGTH} lowercase hex characters"),
        });
    }
    let mut bytes = [0u8; NONCE_BYTES];
    hex::decode_to_slice(nonce, &mut bytes).expect("checked: 32 lowercase hex characters");
    Ok(bytes)
}

pub(crate) fn parse_signature(signature_hex: &str) -> Result<Signature, TrustError> {
    let mut bytes = [0u8; ed25519_dalek::SIGNATURE_LENGTH];
    if signature_hex.len() != SIGNATURE_HEX_LENGTH || hex::decode_to_slice(signature_hex, &mut bytes).is_err() {
        return Err(TrustError::BadHeader {
            name: HEADER_SIGNATURE,
            reason: format!("must be {SIGNATURE_HEX_LENGTH} hex characters"),
        });
    }
    Ok(Signature::from_bytes(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET_HEX: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const NOW_MS: i64 = 1_750_000_000_000;
    const NONCE: &str = "00112233445566778899aabbccddeeff";

    /// Everything `verify_request` looks at, so a test can change one thing.
    struct Request {
        public: VerifyingKey,
        node_id: i64,
        method: String,
        path_and_query: String,
        body: Vec<u8>,
        headers: SignedHeaders,
        now_ms: i64,
    }

    fn signed_request() -> Request {
        let key = NodeKey::from_hex(SECRET_HEX).expect("valid test key");
        let body = br#"{"gpu_seconds_milli":1000}"#.to_vec();
        let headers = key.sign_request(7, "POST", "/v1/nodes/7/usage?x=1", &body, NOW_MS, NONCE);
        Request {
            public: key.verifying_key(),
            node_id: 7,
            method: "POST".to_owned(),
            path_and_query: "/v1/nodes/7/usage?x=1".to_owned(),
            body,
            headers,
            now_ms: NOW_MS,
        }
    }

    /// Signs a request, applies `change` to what the coordinator sees, and verifies it.
    fn verdict(change: impl FnOnce(&mut Request)) -> Result<(), TrustError> {
        let mut request = signed_request();
        change(&mut request);
        verify_request(
            &request.public,
            request.node_id,
            &request.method,
            &request.path_and_query,
            &request.body,
            &request.headers,
            request.now_ms,
            DEFAULT_MAX_SKEW_MS,
        )
    }

    fn check(change: impl FnOnce(&mut Request), expect: Result<(), TrustError>) {
        assert_eq!(verdict(change), expect);
    }

    fn check_bad_header(change: impl FnOnce(&mut Request), name: &'static str) {
        assert_bad_header(verdict(change), name);
    }

    fn assert_bad_header<T: std::fmt::Debug>(result: Result<T, TrustError>, name: &'static str) {
        match result {
            Err(TrustError::BadHeader { name: got, .. }) => assert_eq!(got, name),
            other => panic!("expected BadHeader({name}), got {other:?}"),
        }
    }

    /// `count` signed requests of different nodes, as the coordinator prepares them; those in
    /// `tampered` have a body other than the one signed.
    fn checks(count: usize, tampered: &[usize]) -> Vec<SignatureCheck> {
        (0..count)
            .map(|index| {
                let key = NodeKey::generate();
                let node_id = index as i64 + 1;
                let body = format!("{{\"beat\": {index}}}").into_bytes();
                let headers = key.sign_request(node_id, "POST", "/v1/agent/heartbeat", &body, NOW_MS, NONCE);
                let seen = if tampered.contains(&index) {
                    b"{}".to_vec()
                } else {
                    body
                };
                prepare_request(
                    &key.verifying_key(),
                    node_id,
                    "POST",
                    "/v1/agent/heartbeat",
                    &seen,
                    &headers,
                    NOW_MS,
                    DEFAULT_MAX_SKEW_MS,
                )
                .expect("well-formed")
            })
            .collect()
    }

    #[test]
    fn a_batch_finds_exactly_the_bad_signatures_among_good_ones() {
        for (count, tampered) in [
            (1, vec![]),
            (1, vec![0]),
            (2, vec![1]),
            (64, vec![]),
            (64, vec![0]),
            (64, vec![17, 18, 63]),
            (37, (0..37).collect()),
        ] {
            let checks = checks(count, &tampered);
            let good = verify_checks(&checks);
            let expected: Vec<bool> = (0..count).map(|index| !tampered.contains(&index)).collect();
            assert_eq!(good, expected, "{count} signatures, tampered {tampered:?}");
            for (check, good) in checks.iter().zip(&good) {
                assert_eq!(check.verify().is_ok(), *good, "one by one agrees with the batch");
            }
        }
        assert!(verify_checks(&[]).is_empty());
    }

    #[test]
    fn signed_request_verifies() {
        check(|_| {}, Ok(()));
    }

    #[test]
    fn any_tampered_field_breaks_the_signature() {
        check(|r| r.method = "PUT".to_owned(), Err(TrustError::BadSignature));
        check(
            |r| r.path_and_query = "/v1/nodes/7/usage?x=2".to_owned(),
            Err(TrustError::BadSignature),
        );
        check(|r| r.body.push(b' '), Err(TrustError::BadSignature));
        check(|r| r.body.clear(), Err(TrustError::BadSignature));
        check(|r| r.headers.timestamp_ms += 1, Err(TrustError::BadSignature));
        check(
            |r| r.headers.nonce = "00112233445566778899aabbccddeef0".to_owned(),
            Err(TrustError::BadSignature),
        );
        check(
            |r| {
                r.node_id = 8;
                r.headers.node_id = 8;
            },
            Err(TrustError::BadSignature),
        );
        check(
            |r| r.public = NodeKey::generate().verifying_key(),
            Err(TrustError::BadSignature),
        );
        check(
            |r| {
                let mut signature = hex::decode(&r.headers.signature_hex).expect("hex");
                signature[10] ^= 1;
                r.headers.signature_hex = hex::encode(signature);
            },
            Err(TrustError::BadSignature),
        );
    }

    #[test]
    fn timestamps_outside_the_skew_are_stale_both_ways() {
        let skew = DEFAULT_MAX_SKEW_MS;
        check(|r| r.now_ms += skew, Ok(()));
        check(|r| r.now_ms -= skew, Ok(()));
        check(
            |r| r.now_ms += skew + 1,
            Err(TrustError::Stale { skew_ms: -(skew + 1) }),
        );
        check(|r| r.now_ms -= skew + 1, Err(TrustError::Stale { skew_ms: skew + 1 }));
        // Extreme values from the network saturate instead of overflowing.
        check(
            |r| r.headers.timestamp_ms = i64::MIN,
            Err(TrustError::Stale { skew_ms: i64::MIN }),
        );
        check(
            |r| r.headers.timestamp_ms = i64::MAX,
            Err(TrustError::Stale {
                skew_ms: i64::MAX - NOW_MS,
            }),
        );
    }

    #[test]
    fn malformed_fields_are_bad_headers() {
        check_bad_header(|r| r.node_id = 8, HEADER_NODE);
        check_bad_header(|r| r.headers.nonce = NONCE.to_uppercase(), HEADER_NONCE);
        check_bad_header(|r| r.headers.nonce = NONCE[..30].to_owned(), HEADER_NONCE);
        check_bad_header(|r| r.headers.nonce = format!("{}zz", &NONCE[..30]), HEADER_NONCE);
        check_bad_header(|r| r.headers.signature_hex.truncate(126), HEADER_SIGNATURE);
        check_bad_header(|r| r.headers.signature_hex.replace_range(0..2, "zz"), HEADER_SIGNATURE);
        check_bad_header(|r| r.method = "POST\n/v1".to_owned(), ":method");
        check_bad_header(|r| r.method.clear(), ":method");
        check_bad_header(|r| r.path_and_query.push('\n'), ":path");
    }

    #[test]
    fn canonical_string_is_the_documented_one() {
        let body_digest = blake3::hash(b"{}").to_hex().to_string();
        assert_eq!(
            canonical_request(-3, "GET", "/v1/a?b=c", b"{}", 1_700_000_000_123, NONCE),
            format!("fallow-request-v1\nGET\n/v1/a?b=c\n{body_digest}\n1700000000123\n{NONCE}\n-3")
        );
        assert_eq!(
            body_digest_hex(b""),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn headers_round_trip_through_name_value_pairs() {
        let headers = signed_request().headers;
        let pairs = headers.header_pairs();
        let lookup = |name: &'static str| pairs.iter().find(|(n, _)| *n == name).map(|(_, value)| value.as_str());
        assert_eq!(SignedHeaders::from_headers(lookup), Ok(headers));

        let missing = SignedHeaders::from_headers(|name| if name == HEADER_NONCE { None } else { lookup(name) });
        assert_eq!(
            missing,
            Err(TrustError::BadHeader {
                name: HEADER_NONCE,
                reason: "missing".to_owned()
            })
        );
        let not_a_number = SignedHeaders::from_headers(|name| {
            if name == HEADER_TIMESTAMP {
                Some("soon")
            } else {
                lookup(name)
            }
        });
        assert_bad_header(not_a_number, HEADER_TIMESTAMP);
        let too_big = SignedHeaders::from_headers(|name| {
            if name == HEADER_NODE {
                Some("9223372036854775808")
            } else {
                lookup(name)
            }
        });
        assert_bad_header(too_big, HEADER_NODE);
    }

    #[test]
    fn fresh_nonces_verify_and_differ() {
        let key = NodeKey::generate();
        let first = key.sign_request_now(1, "GET", "/v1/work", b"", NOW_MS);
        let second = key.sign_request_now(1, "GET", "/v1/work", b"", NOW_MS);
        assert_ne!(first.nonce, second.nonce);
        for headers in [&first, &second] {
            assert_eq!(check_nonce_format(&headers.nonce).map(drop), Ok(()));
            let verdict = verify_request(
                &key.verifying_key(),
                1,
                "GET",
                "/v1/work",
                b"",
                headers,
                NOW_MS,
                DEFAULT_MAX_SKEW_MS,
            );
            assert_eq!(verdict, Ok(()));
        }
    }

    #[test]
    fn keys_round_trip_through_hex() {
        let key = NodeKey::generate();
        let again = NodeKey::from_hex(&key.to_hex()).expect("own output parses");
        assert_eq!(again.public_hex(), key.public_hex());
        assert_eq!(parse_public_key(&key.public_hex()), Ok(key.verifying_key()));
        assert!(
            !format!("{key:?}").contains(&key.to_hex()),
            "Debug must not show the secret"
        );
    }

    #[test]
    fn malformed_keys_are_refused_with_reasons() {
        let bad_key = |result: Result<VerifyingKey, TrustError>, words: &str| match result {
            Err(TrustError::BadKey(reason)) => assert!(reason.contains(words), "{reason:?} lacks {words:?}"),
            other => panic!("expected BadKey, got {other:?}"),
        };
        bad_key(parse_public_key("abcd"), "64 hex characters, got 4");
        bad_key(parse_public_key(&"zz".repeat(32)), "must be hex");
        // The identity point, encoded: small order, so weak.
        bad_key(parse_public_key(&format!("01{}", "00".repeat(31))), "weak");
        bad_key(parse_public_key(&format!("02{}", "00".repeat(31))), "not a curve point");

        assert!(matches!(NodeKey::from_hex("abcd"), Err(TrustError::BadKey(_))));
        let non_hex = format!("{}zz", &SECRET_HEX[..62]);
        match NodeKey::from_hex(&non_hex) {
            Err(TrustError::BadKey(reason)) => assert!(!reason.contains(&SECRET_HEX[..8]), "message leaks the key"),
            other => panic!("expected BadKey, got {other:?}"),
        }
    }

    proptest::proptest! {
        #[test]
        fn any_request_round_trips_and_any_body_change_is_caught(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            flip in proptest::prelude::any::<proptest::sample::Index>(),
            node_id in proptest::prelude::any::<i64>(),
            timestamp_ms in -1_000_000i64..1_000_000,
        ) {
            let key = NodeKey::from_hex(SECRET_HEX).expect("valid test key");
            let headers = key.sign_request(node_id, "PUT", "/x", &body, timestamp_ms, NONCE);
            let public = key.verifying_key();
            proptest::prop_assert_eq!(
                verify_request(&public, node_id, "PUT", "/x", &body, &headers, timestamp_ms, 0),
                Ok(())
            );
            let mut changed = body.clone();
            if changed.is_empty() {
                changed.push(0);
            } else {
                let at = flip.index(changed.len());
                changed[at] ^= 0x80;
            }
            proptest::prop_assert_eq!(
                verify_request(&public, node_id, "PUT", "/x", &changed, &headers, timestamp_ms, 0),
                Err(TrustError::BadSignature)
            );
        }
    }
}
