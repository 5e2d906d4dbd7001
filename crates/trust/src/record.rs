//! Signed records: usage per interval and the attestation at a lease's end, signed by the node
//! so that the coordinator can re-verify them later from what it stored.

use serde::{Deserialize, Serialize};

use crate::request::parse_signature;
use crate::{NodeKey, TrustError, VerifyingKey};

const RECORD_DOMAIN: &str = "fallow-record-v1";

/// A record type that nodes sign. `TYPE_NAME` is part of the signed bytes, so a signature over
/// one type never verifies as another; each implementing type needs its own name.
///
/// Changing a record struct's fields changes its JSON and so breaks old signatures: give the
/// changed struct a new `TYPE_NAME` (e.g. `usage-v2`) and keep the old one to verify old records.
pub trait RecordBody: Serialize {
    const TYPE_NAME: &'static str;
}

/// Usage measured on one lease over one interval. Sequence numbers let the coordinator accept
/// each record once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Unknown fields are refused rather than dropped, so what is stored is exactly what was signed.
#[serde(deny_unknown_fields)]
pub struct UsageRecord {
    pub lease_id: i64,
    pub epoch: i64,
    pub sequence: i64,
    pub period_start_ms: i64,
    pub period_end_ms: i64,
    /// GPU-milli × seconds: 1000 is one whole GPU for one second.
    pub gpu_seconds_milli: i64,
    pub gpu_utilisation_permille: i64,
    pub telemetry_digest: String,
}

impl RecordBody for UsageRecord {
    const TYPE_NAME: &'static str = "usage";
}

/// What the node states about a lease when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attestation {
    pub lease_id: i64,
    pub epoch: i64,
    pub image_digest: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub exit_code: i64,
    /// GPU-milli × seconds: 1000 is one whole GPU for one second.
    pub gpu_seconds_milli: i64,
    pub telemetry_digest: String,
    pub log_digest: String,
    /// "blake3:<64 hex>" of the replica's output archive (a tar of `$FALLOW_OUTPUT_DIR`), where
    /// it left one. Left out of the signed bytes when empty, so attestations made before it
    /// existed still verify.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_digest: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_bytes: i64,
}

fn is_zero(value: &i64) -> bool {
    *value == 0
}

impl RecordBody for Attestation {
    const TYPE_NAME: &'static str = "attestation";
}

/// A record with the node's signature over [`record_signed_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedRecord<T> {
    pub body: T,
    pub signature_hex: String,
}

/// The bytes a record signature covers: `"fallow-record-v1\n{TYPE_NAME}\n{node_id}\n"` followed
/// by the body as serde_json. serde_json writes a struct's fields in declaration order with a
/// fixed number and string formatting, so the same body always gives the same bytes, also after
/// a round trip through storage.
pub fn record_signed_bytes<T: RecordBody>(node_id: i64, body: &T) -> Vec<u8> {
    let mut bytes = format!("{RECORD_DOMAIN}\n{}\n{node_id}\n", T::TYPE_NAME).into_bytes();
    serde_json::to_writer(&mut bytes, body).expect("record bodies are structs of integers and strings");
    bytes
}

pub fn sign_record<T: RecordBody + Clone>(key: &NodeKey, node_id: i64, body: &T) -> SignedRecord<T> {
    let signature = key.sign_bytes(&record_signed_bytes(node_id, body));
    SignedRecord {
        body: body.clone(),
        signature_hex: hex::encode(signature.to_bytes()),
    }
}

/// Checks that `node_id`'s key signed this record as this type.
pub fn verify_record<T: RecordBody>(
    public: &VerifyingKey,
    node_id: i64,
    record: &SignedRecord<T>,
) -> Result<(), TrustError> {
    // A malformed signature on a record is still just a bad signature; no header is involved.
    let signature = parse_signature(&record.signature_hex).map_err(|_| TrustError::BadSignature)?;
    public
        .verify_strict(&record_signed_bytes(node_id, &record.body), &signature)
        .map_err(|_| TrustError::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_ID: i64 = 42;

    fn usage() -> UsageRecord {
        UsageRecord {
            lease_id: 7,
            epoch: 2,
            sequence: 15,
            period_start_ms: 1_750_000_000_000,
            period_end_ms: 1_750_000_060_000,
            gpu_seconds_milli: 240_000,
            gpu_utilisation_permille: 870,
            telemetry_digest: "ab".repeat(32),
        }
    }

    fn attestation() -> Attestation {
        Attestation {
            lease_id: 7,
            epoch: 2,
            image_digest: format!("sha256:{}", "cd".repeat(32)),
            start_ms: 1_750_000_000_000,
            end_ms: 1_750_000_900_000,
            exit_code: 0,
            gpu_seconds_milli: 3_600_000,
            telemetry_digest: "ab".repeat(32),
            log_digest: "ef".repeat(32),
            output_digest: String::new(),
            output_bytes: 0,
        }
    }

    #[test]
    fn an_attestation_without_output_signs_the_bytes_it_signed_before_outputs_existed() {
        let bytes = String::from_utf8(record_signed_bytes(3, &attestation())).expect("text");
        assert!(!bytes.contains("output"), "{bytes}");
        let mut with_output = attestation();
        with_output.output_digest = format!("blake3:{}", "12".repeat(32));
        with_output.output_bytes = 10_240;
        let bytes = String::from_utf8(record_signed_bytes(3, &with_output)).expect("text");
        assert!(
            bytes.ends_with(&format!(
                r#""output_digest":"blake3:{}","output_bytes":10240}}"#,
                "12".repeat(32)
            )),
            "{bytes}"
        );
    }

    /// A record type whose JSON equals `UsageRecord`'s, to show that only the type name in
    /// the signed bytes keeps the two apart.
    #[derive(Serialize)]
    #[serde(transparent)]
    struct UsageNamedAsAttestation(UsageRecord);

    impl RecordBody for UsageNamedAsAttestation {
        const TYPE_NAME: &'static str = Attestation::TYPE_NAME;
    }

    #[test]
    fn signed_records_verify() {
        let key = NodeKey::generate();
        let public = key.verifying_key();
        assert_eq!(
            verify_record(&public, NODE_ID, &sign_record(&key, NODE_ID, &usage())),
            Ok(())
        );
        assert_eq!(
            verify_record(&public, NODE_ID, &sign_record(&key, NODE_ID, &attestation())),
            Ok(())
        );
    }

    #[test]
    fn changed_records_nodes_or_keys_fail() {
        let key = NodeKey::generate();
        let public = key.verifying_key();
        let signed = sign_record(&key, NODE_ID, &usage());

        let mut inflated = signed.clone();
        inflated.body.gpu_seconds_milli += 1;
        assert_eq!(
            verify_record(&public, NODE_ID, &inflated),
            Err(TrustError::BadSignature)
        );
        assert_eq!(
            verify_record(&public, NODE_ID + 1, &signed),
            Err(TrustError::BadSignature)
        );
        assert_eq!(
            verify_record(&NodeKey::generate().verifying_key(), NODE_ID, &signed),
            Err(TrustError::BadSignature)
        );
        let garbled = SignedRecord {
            signature_hex: "zz".to_owned(),
            ..signed
        };
        assert_eq!(verify_record(&public, NODE_ID, &garbled), Err(TrustError::BadSignature));
    }

    #[test]
    fn a_usage_signature_does_not_verify_as_an_attestation() {
        let key = NodeKey::generate();
        let public = key.verifying_key();
        let signed = sign_record(&key, NODE_ID, &usage());
        let same_json = UsageNamedAsAttestation(usage());
        assert_eq!(serde_json::to_vec(&same_json).ok(), serde_json::to_vec(&usage()).ok());
        let relabelled = SignedRecord {
            body: same_json,
            signature_hex: signed.signature_hex.clone(),
        };
        assert_eq!(
            verify_record(&public, NODE_ID, &relabelled),
            Err(TrustError::BadSignature)
        );
        let as_attestation = SignedRecord {
            body: attestation(),
            signature_hex: signed.signature_hex,
        };
        assert_eq!(
            verify_record(&public, NODE_ID, &as_attestation),
            Err(TrustError::BadSignature)
        );
    }

    #[test]
    fn records_verify_again_after_a_round_trip_through_storage() {
        let key = NodeKey::generate();
        let stored = serde_json::to_string(&sign_record(&key, NODE_ID, &attestation())).expect("serialisable");
        let loaded: SignedRecord<Attestation> = serde_json::from_str(&stored).expect("own output parses");
        assert_eq!(verify_record(&key.verifying_key(), NODE_ID, &loaded), Ok(()));
    }

    #[test]
    fn unknown_fields_are_refused_not_dropped() {
        let mut json = serde_json::to_value(usage()).expect("serialisable");
        json["bonus_gpu_seconds"] = 1.into();
        assert!(serde_json::from_value::<UsageRecord>(json).is_err());
    }

    #[test]
    fn signed_bytes_are_the_documented_ones() {
        let bytes = record_signed_bytes(NODE_ID, &usage());
        let expected = format!(
            "fallow-record-v1\nusage\n42\n{{\"lease_id\":7,\"epoch\":2,\"sequence\":15,\
             \"period_start_ms\":1750000000000,\"period_end_ms\":1750000060000,\"gpu_seconds_milli\":240000,\
             \"gpu_utilisation_permille\":870,\"telemetry_digest\":\"{}\"}}",
            "ab".repeat(32)
        );
        assert_eq!(String::from_utf8(bytes).expect("utf-8"), expected);
    }
}
