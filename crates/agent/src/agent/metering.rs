//! Metering: each replica's usage, from where metering stopped, signed into usage records and
//! sent; records the coordinator could not be reached for wait to be sent again.

use super::{Agent, now_ms};
use crate::client::ClientError;
use crate::exec::Executor;

/// The most usage records kept for a coordinator that cannot be reached (a day of one replica
/// metered every 10 s); older ones are dropped first.
const UNSENT_USAGE_MAX: usize = 8_640;

impl<E: Executor> Agent<E> {
    /// Sends the usage of replica `id` from where metering stopped to `now_ms`; kept to send
    /// again if the coordinator cannot be reached.
    pub(super) async fn meter(&mut self, id: i64, now: i64) {
        let Some(record) = self.usage_record(id, now) else {
            return;
        };
        self.send_usage(record).await;
    }

    /// Sends a usage record; one the coordinator could not be reached for, or could not take for
    /// now (429, 5xx), waits in `unsent`.
    /// Returns false when it could not be reached.
    async fn send_usage(&mut self, record: trust::UsageRecord) -> bool {
        match self.client.usage(&self.key, self.node_id, &record).await {
            Ok(_) => {
                self.pacer.succeeded();
                true
            }
            Err(error @ ClientError::Refused { .. }) if !error.is_transient() => {
                tracing::warn!(lease = record.lease_id, %error, "a usage record was refused");
                true
            }
            Err(error) => {
                // Unreachable, busy (429) or failing (5xx): kept, and sent again after a wait.
                self.pacer.failed(&error);
                tracing::warn!(lease = record.lease_id, %error, "a usage record waits to be sent again");
                if self.unsent.len() >= UNSENT_USAGE_MAX {
                    self.unsent.pop_front();
                }
                self.unsent.push_back(record);
                false
            }
        }
    }

    /// Sends the usage records that waited for the coordinator, oldest first, while it answers.
    pub(super) async fn send_unsent_usage(&mut self) {
        while let Some(record) = self.unsent.pop_front() {
            let sequence = record.sequence;
            if !self.send_usage(record).await {
                // Put back in front, where it was (`send_usage` queued it last).
                if let Some(record) = self.unsent.pop_back() {
                    debug_assert_eq!(record.sequence, sequence);
                    self.unsent.push_front(record);
                }
                return;
            }
        }
    }

    /// Signs nothing yet: the usage of replica `id` from where metering stopped to `now`, and
    /// metering moves there.
    fn usage_record(&mut self, id: i64, now: i64) -> Option<trust::UsageRecord> {
        let run = self.runs.get_mut(&id)?;
        let period_ms = now - run.metered_to_ms;
        if period_ms <= 0 {
            return None;
        }
        let gpu_seconds_milli = run.gpu_milli * period_ms / 1000;
        run.sequence += 1;
        let utilisation_permille = if run.utilisation_samples > 0 {
            run.utilisation_sum_permille / run.utilisation_samples
        } else {
            self.inventory.utilisation_permille(&run.lease.lease.gpu_indices)
        };
        (run.utilisation_sum_permille, run.utilisation_samples) = (0, 0);
        let record = trust::UsageRecord {
            lease_id: id,
            epoch: run.lease.lease.epoch,
            sequence: run.sequence,
            period_start_ms: run.metered_to_ms,
            period_end_ms: now,
            gpu_seconds_milli,
            gpu_utilisation_permille: utilisation_permille,
            telemetry_digest: format!(
                "blake3:{}",
                blake3::hash(
                    serde_json::to_string(&self.inventory.telemetry())
                        .unwrap_or_default()
                        .as_bytes()
                )
                .to_hex()
            ),
        };
        run.metered_to_ms = now;
        run.gpu_seconds_milli += gpu_seconds_milli;
        Some(record)
    }

    /// Meters replica `id` up to `until_ms` and keeps the record for when the coordinator
    /// answers again: it is being stopped because the coordinator cannot be heard.
    pub(super) fn meter_for_later(&mut self, id: i64, until_ms: i64) {
        if let Some(record) = self.usage_record(id, until_ms.min(now_ms())) {
            if self.unsent.len() >= UNSENT_USAGE_MAX {
                self.unsent.pop_front();
            }
            self.unsent.push_back(record);
        }
    }
}
