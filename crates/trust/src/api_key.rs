//! API keys: made once, shown once, stored only as a hash of their secret part.
//!
//! Format: `fallow_{key_id}_{secret}`, where `key_id` is 12 lowercase hex chars (public: it
//! names the stored row) and `secret` is 32 random bytes as 64 lowercase hex chars.

use crate::TrustError;

pub const API_KEY_PREFIX: &str = "fallow_";
const KEY_ID_BYTES: usize = 6;
const KEY_ID_HEX_LENGTH: usize = 2 * KEY_ID_BYTES;
const SECRET_BYTES: usize = 32;
const SECRET_HEX_LENGTH: usize = 2 * SECRET_BYTES;
/// Length of a whole API key: prefix, key id, `_`, secret.
pub const API_KEY_LENGTH: usize = API_KEY_PREFIX.len() + KEY_ID_HEX_LENGTH + 1 + SECRET_HEX_LENGTH;

/// blake3 key-derivation context: ties stored hashes to this one use, so a hash from another
/// part of the system can never be mistaken for an API key hash.
const SECRET_HASH_CONTEXT: &str = "fallow 2025-01 api key secret v1";

/// A freshly made API key. `display` is shown to the user once and never stored; the store
/// keeps `key_id` and `secret_hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    pub key_id: String,
    pub secret_hash: String,
    pub display: String,
}

/// A new API key from the operating system's random source.
///
/// # Panics
///
/// If the operating system has no random source.
pub fn generate_api_key() -> NewApiKey {
    let key_id = hex::encode(crate::random_bytes::<KEY_ID_BYTES>());
    let secret = hex::encode(crate::random_bytes::<SECRET_BYTES>());
    let display = format!("{API_KEY_PREFIX}{key_id}_{secret}");
    debug_assert_eq!(display.len(), API_KEY_LENGTH);
    NewApiKey {
        key_id,
        secret_hash: hash_secret(&secret),
        display,
    }
}

/// Splits an API key into (key id, secret). Surrounding whitespace (a pasted newline) is
/// ignored. Error messages never repeat the key's text, since callers log them.
pub fn parse_api_key(text: &str) -> Result<(&str, &str), TrustError> {
    let text = text.trim();
    let rest = text.strip_prefix(API_KEY_PREFIX).ok_or_else(|| {
        TrustError::BadApiKey(format!(
            "an API key starts with `{API_KEY_PREFIX}`; copy the whole key as shown"
        ))
    })?;
    if text.len() != API_KEY_LENGTH {
        return Err(TrustError::BadApiKey(format!(
            "an API key is {API_KEY_LENGTH} characters, got {}; copy the whole key as shown",
            text.len()
        )));
    }
    // Length checked and the prefix is ASCII, so these byte offsets are in range; `split_at_checked`
    // still guards against a multi-byte character straddling them.
    let not_ascii = || TrustError::BadApiKey("an API key contains only ASCII letters, digits and `_`".to_owned());
    let (key_id, rest) = rest.split_at_checked(KEY_ID_HEX_LENGTH).ok_or_else(not_ascii)?;
    let secret = rest.strip_prefix('_').ok_or_else(|| {
        TrustError::BadApiKey(format!(
            "an API key has `_` after its {KEY_ID_HEX_LENGTH}-character key id"
        ))
    })?;
    if !is_lowercase_hex(key_id) {
        return Err(TrustError::BadApiKey(format!(
            "the key id (after `{API_KEY_PREFIX}`) is {KEY_ID_HEX_LENGTH} lowercase hex characters"
        )));
    }
    if !is_lowercase_hex(secret) {
        return Err(TrustError::BadApiKey(format!(
            "the secret (after the key id) is {SECRET_HEX_LENGTH} lowercase hex characters"
        )));
    }
    Ok((key_id, secret))
}

/// The stored form of a secret: 64 hex chars. A fast hash is enough, unlike for passwords: the
/// secret is 256 random bits, so there is nothing to guess from a leaked hash.
pub fn hash_secret(secret: &str) -> String {
    secret_hash(secret).to_hex().to_string()
}

/// Whether `secret` matches `stored_hash`, compared in constant time (`blake3::Hash`'s equality
/// is constant-time), so response timing reveals nothing about the stored hash. A malformed
/// stored hash matches nothing.
pub fn verify_secret(secret: &str, stored_hash: &str) -> bool {
    match blake3::Hash::from_hex(stored_hash) {
        Ok(stored) => secret_hash(secret) == stored,
        Err(_) => false,
    }
}

fn secret_hash(secret: &str) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new_derive_key(SECRET_HASH_CONTEXT);
    hasher.update(secret.as_bytes());
    hasher.finalize()
}

fn is_lowercase_hex(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_ID: &str = "0123456789ab";
    const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn key(key_id: &str, secret: &str) -> String {
        format!("{API_KEY_PREFIX}{key_id}_{secret}")
    }

    /// Parses `text` and checks that it fails with a message containing `words`, and never
    /// repeating the secret.
    fn check_refused(text: &str, words: &str) {
        match parse_api_key(text) {
            Err(TrustError::BadApiKey(reason)) => {
                assert!(reason.contains(words), "{reason:?} lacks {words:?}");
                assert!(!reason.contains(&SECRET[..16]), "{reason:?} repeats the secret");
            }
            other => panic!("expected BadApiKey for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn generated_keys_parse_and_verify() {
        let new = generate_api_key();
        assert_eq!(new.display.len(), API_KEY_LENGTH);
        let (key_id, secret) = parse_api_key(&new.display).expect("own output parses");
        assert_eq!(key_id, new.key_id);
        assert!(verify_secret(secret, &new.secret_hash));
        assert!(!new.secret_hash.contains(secret), "the stored hash is not the secret");
        assert_ne!(generate_api_key().display, new.display);
    }

    #[test]
    fn wrong_secrets_and_broken_hashes_do_not_match() {
        let hash = hash_secret(SECRET);
        assert!(verify_secret(SECRET, &hash));
        assert!(!verify_secret(&SECRET.replace("ff", "fe"), &hash));
        assert!(!verify_secret(SECRET, "not a hash"));
        assert!(!verify_secret(SECRET, ""));
        // Hashes are tied to their context: not a plain blake3 of the secret.
        assert_ne!(hash, blake3::hash(SECRET.as_bytes()).to_hex().to_string());
    }

    #[test]
    fn well_formed_keys_parse_with_surrounding_whitespace() {
        assert_eq!(
            parse_api_key(&format!("  {}\n", key(KEY_ID, SECRET))),
            Ok((KEY_ID, SECRET))
        );
    }

    #[test]
    fn malformed_keys_say_what_is_wrong() {
        check_refused(&format!("sk_{KEY_ID}_{SECRET}"), "starts with `fallow_`");
        check_refused(&format!("Fallow_{KEY_ID}_{SECRET}"), "starts with `fallow_`");
        check_refused(&key(KEY_ID, &SECRET[..63]), "84 characters, got 83");
        check_refused(&format!("{}0", key(KEY_ID, SECRET)), "84 characters, got 85");
        check_refused(
            &format!("{API_KEY_PREFIX}{KEY_ID}-{SECRET}"),
            "`_` after its 12-character key id",
        );
        check_refused(&key("0123456789AB", SECRET), "key id");
        check_refused(&key("0123456789ag", SECRET), "key id");
        check_refused(&key(KEY_ID, &SECRET.to_uppercase()), "secret");
        check_refused(&key(KEY_ID, &format!("{}_x", &SECRET[..62])), "secret");
        // 'é' is two bytes: right length in bytes, a character straddling the key id's end.
        check_refused(&key("0123456789aé", &SECRET[..63]), "ASCII");
    }
}
