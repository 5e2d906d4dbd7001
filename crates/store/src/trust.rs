//! The trust policy's durable state: canaries and what they found, fraud decided with its
//! evidence and slash, the fraud cordon on nodes, and the reads that rules need (decayed
//! outcomes by day, violations in a window, what tenants paid for a node's work).

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{CanaryStanding, EvidenceRow, OverdueCanary, ProviderFraud, ReputationEvent, Result, Store, TenantCharge};

/// A canary to order on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCanary {
    pub node_id: i64,
    /// hash or matmul (`api::CanaryKind`).
    pub kind: String,
    pub seed: String,
    pub units: i64,
    /// JSON array of GPU indexes.
    pub gpus: String,
    pub memory_mib: i64,
    pub claimed_model: String,
    pub expected_rate_milli: i64,
    pub fingerprint: String,
    pub created_at: i64,
    pub deadline_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryRow {
    pub id: i64,
    pub canary: NewCanary,
    pub delivered_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub finding: Option<String>,
    pub rate_milli: Option<i64>,
    pub result: Option<String>,
    pub signature: Option<String>,
    /// A matmul canary's challenge seed (hex), drawn once its committed result came in, and when.
    pub challenge: Option<String>,
    pub challenged_at: Option<i64>,
    /// Why the finding is what it is, in words.
    pub reason: Option<String>,
}

/// A fraud decision to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FraudRow {
    pub id: i64,
    pub node_id: i64,
    pub provider_id: i64,
    pub kind: String,
    pub section: String,
    pub share_permille: i64,
    pub bond_before: i64,
    pub slashed: i64,
    /// JSON: `[{"tenant_id", "owed_micros", "paid_micros"}]`.
    pub refunds: String,
    pub to_platform: i64,
    /// JSON: the evidence the decision rests on.
    pub evidence: String,
    pub decided_at: i64,
    /// The slash's ledger key: one decision per key.
    pub ledger_key: String,
}

const CANARY_COLUMNS: &str = "id, node_id, seed, units, gpus, memory_mib, claimed_model, expected_rate_milli, \
    fingerprint, created_at, deadline_at, delivered_at, finished_at, finding, rate_milli, result, signature, kind, \
    challenge, challenged_at, reason";

const FRAUD_COLUMNS: &str = "id, node_id, provider_id, kind, section, share_permille, bond_before, slashed, refunds, \
    to_platform, evidence, decided_at, ledger_key";

fn canary_from(row: &AnyRow) -> Result<CanaryRow> {
    Ok(CanaryRow {
        id: row.try_get("id")?,
        canary: NewCanary {
            node_id: row.try_get("node_id")?,
            kind: row.try_get("kind")?,
            seed: row.try_get("seed")?,
            units: row.try_get("units")?,
            gpus: row.try_get("gpus")?,
            memory_mib: row.try_get("memory_mib")?,
            claimed_model: row.try_get("claimed_model")?,
            expected_rate_milli: row.try_get("expected_rate_milli")?,
            fingerprint: row.try_get("fingerprint")?,
            created_at: row.try_get("created_at")?,
            deadline_at: row.try_get("deadline_at")?,
        },
        delivered_at: row.try_get("delivered_at")?,
        finished_at: row.try_get("finished_at")?,
        finding: row.try_get("finding")?,
        rate_milli: row.try_get("rate_milli")?,
        result: row.try_get("result")?,
        signature: row.try_get("signature")?,
        challenge: row.try_get("challenge")?,
        challenged_at: row.try_get("challenged_at")?,
        reason: row.try_get("reason")?,
    })
}

fn fraud_from(row: &AnyRow) -> Result<FraudRow> {
    Ok(FraudRow {
        id: row.try_get("id")?,
        node_id: row.try_get("node_id")?,
        provider_id: row.try_get("provider_id")?,
        kind: row.try_get("kind")?,
        section: row.try_get("section")?,
        share_permille: row.try_get("share_permille")?,
        bond_before: row.try_get("bond_before")?,
        slashed: row.try_get("slashed")?,
        refunds: row.try_get("refunds")?,
        to_platform: row.try_get("to_platform")?,
        evidence: row.try_get("evidence")?,
        decided_at: row.try_get("decided_at")?,
        ledger_key: row.try_get("ledger_key")?,
    })
}

async fn insert_canary_in(db: &mut sqlx::Transaction<'_, sqlx::Any>, canary: &NewCanary) -> Result<i64> {
    let row = sqlx::query(
        "INSERT INTO canaries (node_id, seed, units, gpus, memory_mib, claimed_model, expected_rate_milli, \
         fingerprint, created_at, deadline_at, kind) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
    )
    .bind(canary.node_id)
    .bind(&canary.seed)
    .bind(canary.units)
    .bind(&canary.gpus)
    .bind(canary.memory_mib)
    .bind(&canary.claimed_model)
    .bind(canary.expected_rate_milli)
    .bind(&canary.fingerprint)
    .bind(canary.created_at)
    .bind(canary.deadline_at)
    .bind(&canary.kind)
    .fetch_one(&mut **db)
    .await?;
    Ok(row.try_get("id")?)
}

impl Store {
    pub async fn insert_canary(&self, canary: &NewCanary) -> Result<i64> {
        Ok(self.insert_canaries(std::slice::from_ref(canary)).await?[0])
    }

    /// Orders canaries in one transaction; their ids, in order.
    pub async fn insert_canaries(&self, canaries: &[NewCanary]) -> Result<Vec<i64>> {
        let mut db = self.begin_write().await?;
        let mut ids = Vec::with_capacity(canaries.len());
        for canary in canaries {
            ids.push(insert_canary_in(&mut db, canary).await?);
        }
        db.commit().await?;
        Ok(ids)
    }

    pub async fn canary(&self, id: i64) -> Result<Option<CanaryRow>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CANARY_COLUMNS} FROM canaries WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(canary_from).transpose()
    }

    /// The nodes with a canary not yet finished.
    pub async fn open_canary_nodes(&self) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT DISTINCT node_id FROM canaries WHERE finished_at IS NULL")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| Ok(row.try_get("node_id")?)).collect()
    }

    /// A node's canaries not yet finished, oldest first.
    pub async fn open_canaries_of_node(&self, node_id: i64) -> Result<Vec<CanaryRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CANARY_COLUMNS} FROM canaries WHERE node_id = $1 AND finished_at IS NULL ORDER BY id"
        )))
        .bind(node_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(canary_from).collect()
    }

    /// Notes when canaries first reached their nodes (the coordinator's clock for their rates):
    /// (canary, when), a statement per `ROWS_PER_STATEMENT_MAX`; a canary delivered before keeps
    /// its first time.
    pub async fn mark_canaries_delivered(&self, deliveries: &[(i64, i64)]) -> Result<()> {
        for chunk in deliveries.chunks(crate::ledger::ROWS_PER_STATEMENT_MAX) {
            let cases = (0..chunk.len())
                .map(|row| {
                    format!(
                        "WHEN CAST(${} AS BIGINT) THEN CAST(${} AS BIGINT)",
                        2 * row + 1,
                        2 * row + 2
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            let ids = (0..chunk.len())
                .map(|row| format!("${}", 2 * row + 1))
                .collect::<Vec<_>>()
                .join(", ");
            let query = format!(
                "UPDATE canaries SET delivered_at = CASE id {cases} END WHERE id IN ({ids}) AND delivered_at IS NULL"
            );
            let mut update = sqlx::query(sqlx::AssertSqlSafe(query));
            for (id, at) in chunk {
                update = update.bind(*id).bind(*at);
            }
            update.execute(&self.pool).await?;
        }
        Ok(())
    }

    /// Records a canary's finding, the signed result (body JSON, signature) when given (a
    /// challenged matmul canary keeps the one it has) and why; false when it had already finished.
    pub async fn finish_canary(
        &self,
        id: i64,
        finding: &str,
        rate_milli: Option<i64>,
        result: Option<(&str, &str)>,
        reason: Option<&str>,
        now: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE canaries SET finished_at = $1, finding = $2, rate_milli = $3, result = COALESCE($4, result), \
             signature = COALESCE($5, signature), reason = $6 WHERE id = $7 AND finished_at IS NULL",
        )
        .bind(now)
        .bind(finding)
        .bind(rate_milli)
        .bind(result.map(|(body, _)| body.to_string()))
        .bind(result.map(|(_, signature)| signature.to_string()))
        .bind(reason)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a matmul canary's signed, committed result and the challenge drawn for it; false
    /// when the canary finished or was challenged already (a result is taken once).
    pub async fn challenge_canary(
        &self,
        id: i64,
        challenge_hex: &str,
        result: (&str, &str),
        rate_milli: i64,
        now: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE canaries SET challenge = $1, challenged_at = $2, result = $3, signature = $4, rate_milli = $5 \
             WHERE id = $6 AND finished_at IS NULL AND challenge IS NULL",
        )
        .bind(challenge_hex)
        .bind(now)
        .bind(result.0)
        .bind(result.1)
        .bind(rate_milli)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Notes the canary kinds a node's agent can run besides hash (comma-separated).
    pub async fn set_node_canary_kinds(&self, node_id: i64, kinds: &str) -> Result<()> {
        sqlx::query("UPDATE nodes SET canary_kinds = $1 WHERE id = $2")
            .bind(kinds)
            .bind(node_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The canary kinds a node's agent said it can run besides hash (comma-separated; empty
    /// for an unknown node).
    pub async fn node_canary_kinds(&self, node_id: i64) -> Result<String> {
        let row = sqlx::query("SELECT canary_kinds FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => row.try_get("canary_kinds")?,
            None => String::new(),
        })
    }

    /// The nodes whose agents can run canaries of `kind`, by id.
    pub async fn nodes_with_canary_kind(&self, kind: &str) -> Result<std::collections::HashSet<i64>> {
        let rows = sqlx::query("SELECT id, canary_kinds FROM nodes WHERE canary_kinds <> ''")
            .fetch_all(&self.pool)
            .await?;
        let mut nodes = std::collections::HashSet::new();
        for row in rows {
            let kinds: String = row.try_get("canary_kinds")?;
            if kinds.split(',').any(|named| named == kind) {
                nodes.insert(row.try_get("id")?);
            }
        }
        Ok(nodes)
    }

    /// Gives up the open canaries whose deadline passed before `now` as unanswered, in one
    /// statement; returns them.
    pub async fn give_up_overdue_canaries(&self, now: i64) -> Result<Vec<OverdueCanary>> {
        let rows = sqlx::query(
            "UPDATE canaries SET finished_at = $1, finding = 'unanswered' \
             WHERE finished_at IS NULL AND deadline_at < $1 RETURNING id, node_id",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(OverdueCanary {
                    canary_id: row.try_get("id")?,
                    node_id: row.try_get("node_id")?,
                })
            })
            .collect()
    }

    /// Withdraws an open canary whose GPUs work took (`withdrawn`: it counts neither as answered
    /// nor as unanswered); false when it had finished already.
    pub async fn withdraw_canary(&self, id: i64, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE canaries SET finished_at = $1, finding = 'withdrawn' WHERE id = $2 AND finished_at IS NULL",
        )
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Every node's latest canary.
    pub async fn latest_canaries(&self) -> Result<Vec<CanaryRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CANARY_COLUMNS} FROM canaries WHERE id IN (SELECT MAX(id) FROM canaries GROUP BY node_id)"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(canary_from).collect()
    }

    /// A node's canaries, newest first.
    pub async fn canaries_of_node(&self, node_id: i64, limit: i64) -> Result<Vec<CanaryRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CANARY_COLUMNS} FROM canaries WHERE node_id = $1 ORDER BY id DESC LIMIT $2"
        )))
        .bind(node_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(canary_from).collect()
    }

    /// The fraud decisions that paid `tenant` back, newest first: their refunds name it.
    pub async fn frauds_refunding(&self, tenant: i64, limit: i64) -> Result<Vec<FraudRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {FRAUD_COLUMNS} FROM frauds WHERE refunds LIKE $1 ORDER BY id DESC LIMIT $2"
        )))
        .bind(format!("%\"tenant_id\":{tenant},%"))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(fraud_from).collect()
    }

    /// The latest canary of each of a provider's nodes.
    pub async fn latest_canaries_of_provider(&self, provider_id: i64) -> Result<Vec<CanaryRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CANARY_COLUMNS} FROM canaries WHERE id IN (SELECT MAX(c.id) FROM canaries c \
             JOIN nodes n ON n.id = c.node_id WHERE n.provider_id = $1 GROUP BY c.node_id)"
        )))
        .bind(provider_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(canary_from).collect()
    }

    /// Fraud decisions, newest first: all, or a provider's.
    pub async fn frauds(&self, provider_id: Option<i64>, limit: i64) -> Result<Vec<FraudRow>> {
        let rows = match provider_id {
            Some(provider) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT {FRAUD_COLUMNS} FROM frauds WHERE provider_id = $1 ORDER BY id DESC LIMIT $2"
                )))
                .bind(provider)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT {FRAUD_COLUMNS} FROM frauds ORDER BY id DESC LIMIT $1"
                )))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
        };
        rows.iter().map(fraud_from).collect()
    }

    /// Lifts a node's fraud cordon (a canary passed on its current hardware); moves the node's
    /// `updated_at` so every replica's view picks it up.
    pub async fn lift_fraud_cordon(&self, node_id: i64, now: i64) -> Result<()> {
        sqlx::query("UPDATE nodes SET fraud_cordoned_at = NULL, updated_at = $1 WHERE id = $2")
            .bind(now)
            .bind(node_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Reputation outcomes recorded at or after `since` (µs), oldest first, at most `limit`. How
    /// a replica keeps its reputations current without reading every outcome again.
    pub async fn outcomes_since(&self, since: i64, limit: i64) -> Result<Vec<ReputationEvent>> {
        let rows = sqlx::query(
            "SELECT id, node_id, outcome, weight_milli, at FROM reputation_events WHERE at >= $1 \
             ORDER BY at, id LIMIT $2",
        )
        .bind(since)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ReputationEvent {
                    id: row.try_get("id")?,
                    node_id: row.try_get("node_id")?,
                    outcome: row.try_get("outcome")?,
                    weight_milli: row.try_get("weight_milli")?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }

    /// Per node, the canaries that decide whether it may take gold work: the finding and time
    /// of its latest answered canary (passed, wrong_answer or slow), and how many canaries went
    /// unanswered after it.
    pub async fn canary_standings(&self) -> Result<Vec<CanaryStanding>> {
        let rows = sqlx::query(
            "SELECT n.node_id AS node_id, a.finding AS finding, a.finished_at AS finished_at, \
             CAST((SELECT COUNT(*) FROM canaries u WHERE u.node_id = n.node_id AND u.finding = 'unanswered' \
               AND u.id > COALESCE(n.answered, 0)) AS BIGINT) AS unanswered \
             FROM (SELECT node_id, MAX(CASE WHEN finding IN ('passed', 'wrong_answer', 'slow') THEN id END) AS answered \
                   FROM canaries GROUP BY node_id) n \
             LEFT JOIN canaries a ON a.id = n.answered ORDER BY n.node_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(CanaryStanding {
                    node_id: row.try_get("node_id")?,
                    finding: row.try_get("finding")?,
                    finished_at: row.try_get("finished_at")?,
                    unanswered: row.try_get("unanswered")?,
                })
            })
            .collect()
    }

    /// The weight (thousandths) of a node's outcomes of `outcome` recorded at or after `since`,
    /// undecayed: how many committed window hours it had, say.
    pub async fn outcome_weight_since(&self, node_id: i64, outcome: &str, since: i64) -> Result<i64> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(weight_milli), 0) AS BIGINT) AS weight_milli FROM reputation_events \
             WHERE node_id = $1 AND outcome = $2 AND at >= $3",
        )
        .bind(node_id)
        .bind(outcome)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("weight_milli")?)
    }

    /// Records a fraud decision in one transaction with its slash (a ledger transaction and
    /// its floors) and the node's cordon: all of it, or nothing when a decision with the same
    /// ledger key exists (`None`). Moves the node's `updated_at`, so every replica's view
    /// takes the cordon.
    pub async fn record_fraud(
        &self,
        fraud: &FraudRow,
        slash: Option<(&crate::LedgerTransactionRow, &[i64])>,
    ) -> Result<Option<i64>> {
        let mut db = self.begin_write().await?;
        let row = sqlx::query(
            "INSERT INTO frauds (node_id, provider_id, kind, section, share_permille, bond_before, slashed, refunds, \
             to_platform, evidence, decided_at, ledger_key) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (ledger_key) DO NOTHING RETURNING id",
        )
        .bind(fraud.node_id)
        .bind(fraud.provider_id)
        .bind(&fraud.kind)
        .bind(&fraud.section)
        .bind(fraud.share_permille)
        .bind(fraud.bond_before)
        .bind(fraud.slashed)
        .bind(&fraud.refunds)
        .bind(fraud.to_platform)
        .bind(&fraud.evidence)
        .bind(fraud.decided_at)
        .bind(&fraud.ledger_key)
        .fetch_optional(&mut *db)
        .await?;
        let Some(row) = row else {
            db.rollback().await?;
            return Ok(None);
        };
        let id: i64 = row.try_get("id")?;
        if let Some((transaction, floors)) = slash {
            match crate::ledger::apply_ledger_in(&mut db, transaction, floors).await {
                Ok(crate::LedgerOutcome::New) => {}
                Ok(crate::LedgerOutcome::Duplicate) => {
                    db.rollback().await?;
                    return Ok(None);
                }
                Err(error) => {
                    db.rollback().await?;
                    return Err(error);
                }
            }
        }
        sqlx::query("UPDATE nodes SET fraud_cordoned_at = $1, updated_at = $1 WHERE id = $2")
            .bind(fraud.decided_at)
            .bind(fraud.node_id)
            .execute(&mut *db)
            .await?;
        db.commit().await?;
        Ok(Some(id))
    }

    /// When fraud was last proven against a node, if ever.
    pub async fn last_fraud_of_node(&self, node_id: i64) -> Result<Option<i64>> {
        let row = sqlx::query("SELECT CAST(MAX(decided_at) AS BIGINT) AS at FROM frauds WHERE node_id = $1")
            .bind(node_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("at")?)
    }

    /// Every provider's last fraud decision, by provider id.
    pub async fn last_frauds_of_providers(&self) -> Result<Vec<ProviderFraud>> {
        let rows = sqlx::query(
            "SELECT provider_id, CAST(MAX(decided_at) AS BIGINT) AS at FROM frauds GROUP BY provider_id ORDER BY provider_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ProviderFraud {
                    provider_id: row.try_get("provider_id")?,
                    decided_at: row.try_get("at")?,
                })
            })
            .collect()
    }

    /// Moves a node's `updated_at`, so every replica's matcher view is rebuilt with what changed
    /// about it elsewhere (a canary's finding, say).
    pub async fn touch_node(&self, node_id: i64, now: i64) -> Result<()> {
        sqlx::query("UPDATE nodes SET updated_at = $1 WHERE id = $2")
            .bind(now)
            .bind(node_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A node's evidence rows of the given kinds at or after `since`, oldest first.
    pub async fn evidence_of_kinds_since(&self, node_id: i64, kinds: &[&str], since: i64) -> Result<Vec<EvidenceRow>> {
        let rows = sqlx::query(
            "SELECT id, node_id, kind, detail, at FROM evidence WHERE node_id = $1 AND at >= $2 ORDER BY at, id",
        )
        .bind(node_id)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::new();
        for row in &rows {
            let kind: String = row.try_get("kind")?;
            if kinds.contains(&kind.as_str()) {
                out.push(EvidenceRow {
                    id: row.try_get("id")?,
                    node_id: row.try_get("node_id")?,
                    kind,
                    detail: row.try_get("detail")?,
                    at: row.try_get("at")?,
                });
            }
        }
        Ok(out)
    }

    /// What each tenant was charged for usage on a node received at or after `since`, in the
    /// order of their first charge.
    pub async fn charges_on_node_since(&self, node_id: i64, since: i64) -> Result<Vec<TenantCharge>> {
        let rows = sqlx::query(
            "SELECT j.tenant_id AS tenant_id, CAST(SUM(u.charged_micros) AS BIGINT) AS charged, \
             CAST(MIN(u.received_at) AS BIGINT) AS first_at \
             FROM usage_records u JOIN leases l ON l.id = u.lease_id JOIN jobs j ON j.id = l.job_id \
             WHERE u.node_id = $1 AND u.received_at >= $2 AND u.charged_micros > 0 \
             GROUP BY j.tenant_id ORDER BY first_at, j.tenant_id",
        )
        .bind(node_id)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(TenantCharge {
                    tenant_id: row.try_get("tenant_id")?,
                    charged_micros: row.try_get("charged")?,
                })
            })
            .collect()
    }
}
