//! Capacity set aside: reservations booked ahead (the nodes each holds and for when, the jobs
//! that run inside them; a booking, a change of its nodes and its end each write their money in
//! the same transaction as their rows), and the provider accounts a tenant owns (hybrid).

use sqlx::Row;

use crate::jobs::check_fence;
use crate::ledger::apply_ledger_in;
use crate::{LedgerTransactionRow, Result, Store, StoreError};

/// A reservation's states: booked (before its start), active, then ended or cancelled.
pub const RESERVATION_LIVE: [&str; 2] = ["booked", "active"];

/// One node's part of a reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationNode {
    pub node_id: i64,
    pub gpus: i64,
    /// Per GPU-hour, fixed at booking (or at the replacement's booking).
    pub price_micros: i64,
    pub held_from: i64,
    pub held_until: i64,
    /// When the node was lost for the booking; `held_until` is then no later.
    pub lost_at: Option<i64>,
}

/// A booking to write: its rows but the id the store gives it.
#[derive(Clone, Debug)]
pub struct NewReservation {
    pub tenant_id: i64,
    /// The tenant's request as JSON (the `api` crate's wire form).
    pub request: String,
    pub gpus: i64,
    pub gpu_model: String,
    pub starts_at: i64,
    pub ends_at: i64,
    pub hold_micros: i64,
    pub nodes: Vec<ReservationNode>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationRecord {
    pub id: i64,
    pub tenant_id: i64,
    pub state: String,
    pub state_reason: String,
    pub request: String,
    pub gpus: i64,
    pub gpu_model: String,
    pub starts_at: i64,
    pub ends_at: i64,
    pub hold_micros: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// Every node row, lost ones included, in the order they were added.
    pub nodes: Vec<ReservationNode>,
}

impl ReservationRecord {
    /// The node rows that still hold GPUs for the booking.
    pub fn held(&self) -> impl Iterator<Item = &ReservationNode> {
        self.nodes.iter().filter(|node| node.lost_at.is_none())
    }

    pub fn is_live(&self) -> bool {
        RESERVATION_LIVE.contains(&self.state.as_str())
    }
}

/// A ledger transaction and the floors of its accounts (`server::money::row`).
pub type LedgerWrite = (LedgerTransactionRow, Vec<i64>);

const COLUMNS: &str = "id, tenant_id, state, state_reason, request, gpus, gpu_model, starts_at, ends_at, \
                       hold_micros, created_at, updated_at";

impl Store {
    /// Writes a booking and its escrow hold (built by `hold` from the id the store gives it) in
    /// one transaction, fenced like placements: only the leader books, on its view.
    pub async fn book_reservation(
        &self,
        new: &NewReservation,
        hold: impl FnOnce(i64) -> std::result::Result<LedgerWrite, String>,
        now: i64,
        fence: i64,
    ) -> Result<ReservationRecord> {
        let mut transaction = self.begin_write().await?;
        check_fence(&mut transaction, fence).await?;
        let row = sqlx::query(
            "INSERT INTO reservations (tenant_id, state, state_reason, request, gpus, gpu_model, starts_at, ends_at, \
             hold_micros, created_at, updated_at) VALUES ($1, 'booked', '', $2, $3, $4, $5, $6, $7, $8, $8) RETURNING id",
        )
        .bind(new.tenant_id)
        .bind(&new.request)
        .bind(new.gpus)
        .bind(&new.gpu_model)
        .bind(new.starts_at)
        .bind(new.ends_at)
        .bind(new.hold_micros)
        .bind(now)
        .fetch_one(&mut *transaction)
        .await?;
        let id: i64 = row.try_get("id")?;
        for node in &new.nodes {
            insert_node(&mut transaction, id, node).await?;
        }
        let (ledger_row, floors) = hold(id).map_err(StoreError::Refused)?;
        apply_ledger_in(&mut transaction, &ledger_row, &floors).await?;
        transaction.commit().await?;
        self.reservation(id)
            .await?
            .ok_or_else(|| StoreError::Refused(format!("reservation {id} vanished after its booking")))
    }

    pub async fn reservation(&self, id: i64) -> Result<Option<ReservationRecord>> {
        let query = format!("SELECT {COLUMNS} FROM reservations WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => {
                let mut records = self.with_nodes(vec![reservation_from(&row)?]).await?;
                Ok(records.pop())
            }
            None => Ok(None),
        }
    }

    /// A tenant's reservations, newest first.
    pub async fn reservations_of_tenant(&self, tenant_id: i64) -> Result<Vec<ReservationRecord>> {
        let query = format!("SELECT {COLUMNS} FROM reservations WHERE tenant_id = $1 ORDER BY id DESC");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(tenant_id)
            .fetch_all(&self.pool)
            .await?;
        let records = rows.iter().map(reservation_from).collect::<Result<Vec<_>>>()?;
        self.with_nodes(records).await
    }

    /// Reservations booked or running, oldest first: what the matcher's view holds.
    pub async fn live_reservations(&self) -> Result<Vec<ReservationRecord>> {
        let query = format!("SELECT {COLUMNS} FROM reservations WHERE state IN ('booked', 'active') ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query)).fetch_all(&self.pool).await?;
        let records = rows.iter().map(reservation_from).collect::<Result<Vec<_>>>()?;
        self.with_nodes(records).await
    }

    /// Live reservations whose start (booked) or end (active) has come by `now`.
    pub async fn reservations_due(&self, now: i64) -> Result<Vec<ReservationRecord>> {
        let query = format!(
            "SELECT {COLUMNS} FROM reservations WHERE (state = 'booked' AND starts_at <= $1) \
             OR (state = 'active' AND ends_at <= $1) ORDER BY id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(now)
            .fetch_all(&self.pool)
            .await?;
        let records = rows.iter().map(reservation_from).collect::<Result<Vec<_>>>()?;
        self.with_nodes(records).await
    }

    /// Live reservations that hold GPUs on the node.
    pub async fn reservations_holding(&self, node_id: i64) -> Result<Vec<ReservationRecord>> {
        let rows = sqlx::query(
            "SELECT DISTINCT reservation_id FROM reservation_nodes n JOIN reservations r ON r.id = n.reservation_id \
             WHERE n.node_id = $1 AND n.lost_at IS NULL AND r.state IN ('booked', 'active') ORDER BY reservation_id",
        )
        .bind(node_id)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            if let Some(record) = self.reservation(row.try_get("reservation_id")?).await? {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// The windows booked on a node that end after `since` (none that a cancellation or a loss
    /// closed before it opened), with their reservations, by start.
    pub async fn node_calendar(&self, node_id: i64, since: i64) -> Result<Vec<(ReservationRecord, ReservationNode)>> {
        let rows = sqlx::query(
            "SELECT reservation_id, node_id, gpus, price_micros, held_from, held_until, lost_at FROM reservation_nodes \
             WHERE node_id = $1 AND held_until > $2 AND held_until > held_from ORDER BY held_from, reservation_id",
        )
        .bind(node_id)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let node = node_from(&row)?;
            if let Some(record) = self.reservation(row.try_get("reservation_id")?).await? {
                out.push((record, node));
            }
        }
        Ok(out)
    }

    /// Moves a live reservation on from `from` states to `to` with `reason`, writing `money` in
    /// the same transaction. False (and nothing written) when it was not in one of `from`.
    pub async fn transition_reservation(
        &self,
        id: i64,
        from: &[&str],
        to: &str,
        reason: &str,
        money: &[LedgerWrite],
        now: i64,
    ) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let query = format!(
            "UPDATE reservations SET state = $1, state_reason = $2, updated_at = $3 WHERE id = $4 AND state IN ({})",
            crate::jobs::placeholders(5, from.len())
        );
        let mut update = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(to)
            .bind(reason)
            .bind(now)
            .bind(id);
        for state in from {
            update = update.bind(*state);
        }
        if update.execute(&mut *transaction).await?.rows_affected() != 1 {
            return Ok(false);
        }
        if to != "active" {
            // An ended or cancelled booking holds its nodes no longer (one cancelled before its
            // start held them for no time: the window closes where it would have opened).
            sqlx::query(
                "UPDATE reservation_nodes SET held_until = CASE WHEN held_from > $1 THEN held_from ELSE $1 END \
                 WHERE reservation_id = $2 AND held_until > $1",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *transaction)
            .await?;
        }
        for (row, floors) in money {
            apply_ledger_in(&mut transaction, row, floors).await?;
        }
        transaction.commit().await?;
        Ok(true)
    }

    /// A node of a live reservation is lost at `at`: its row ends there, and `replacements`
    /// (nodes the leader booked in its place) are added, or `refund` written. Fenced: the leader
    /// decides it on its view.
    pub async fn lose_reservation_node(
        &self,
        id: i64,
        node_id: i64,
        at: i64,
        replacements: &[ReservationNode],
        refund: Option<&LedgerWrite>,
        fence: i64,
    ) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        check_fence(&mut transaction, fence).await?;
        let lost = sqlx::query(
            "UPDATE reservation_nodes SET lost_at = $1, held_until = CASE WHEN held_from > $1 THEN held_from ELSE $1 END \
             WHERE reservation_id = $2 AND node_id = $3 AND lost_at IS NULL \
             AND reservation_id IN (SELECT id FROM reservations WHERE state IN ('booked', 'active'))",
        )
        .bind(at)
        .bind(id)
        .bind(node_id)
        .execute(&mut *transaction)
        .await?;
        if lost.rows_affected() == 0 {
            return Ok(false);
        }
        for node in replacements {
            insert_node(&mut transaction, id, node).await?;
        }
        if let Some((row, floors)) = refund {
            apply_ledger_in(&mut transaction, row, floors).await?;
        }
        sqlx::query("UPDATE reservations SET updated_at = $1 WHERE id = $2")
            .bind(at)
            .bind(id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// Live jobs that run inside a reservation: (job, reservation).
    pub async fn reservation_members(&self) -> Result<Vec<(i64, i64)>> {
        let rows = sqlx::query(
            "SELECT id, reservation_id FROM jobs WHERE reservation_id IS NOT NULL AND state IN ('queued', 'running') \
             ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("id")?, row.try_get("reservation_id")?)))
            .collect()
    }

    async fn with_nodes(&self, mut records: Vec<ReservationRecord>) -> Result<Vec<ReservationRecord>> {
        for record in &mut records {
            let rows = sqlx::query(
                "SELECT node_id, gpus, price_micros, held_from, held_until, lost_at FROM reservation_nodes \
                 WHERE reservation_id = $1 ORDER BY held_from, node_id",
            )
            .bind(record.id)
            .fetch_all(&self.pool)
            .await?;
            record.nodes = rows.iter().map(node_from).collect::<Result<Vec<_>>>()?;
        }
        Ok(records)
    }
}

async fn insert_node(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    reservation_id: i64,
    node: &ReservationNode,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO reservation_nodes (reservation_id, node_id, gpus, price_micros, held_from, held_until, lost_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(reservation_id)
    .bind(node.node_id)
    .bind(node.gpus)
    .bind(node.price_micros)
    .bind(node.held_from)
    .bind(node.held_until)
    .bind(node.lost_at)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

fn reservation_from(row: &sqlx::any::AnyRow) -> Result<ReservationRecord> {
    Ok(ReservationRecord {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        state: row.try_get("state")?,
        state_reason: row.try_get("state_reason")?,
        request: row.try_get("request")?,
        gpus: row.try_get("gpus")?,
        gpu_model: row.try_get("gpu_model")?,
        starts_at: row.try_get("starts_at")?,
        ends_at: row.try_get("ends_at")?,
        hold_micros: row.try_get("hold_micros")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        nodes: Vec::new(),
    })
}

fn node_from(row: &sqlx::any::AnyRow) -> Result<ReservationNode> {
    Ok(ReservationNode {
        node_id: row.try_get("node_id")?,
        gpus: row.try_get("gpus")?,
        price_micros: row.try_get("price_micros")?,
        held_from: row.try_get("held_from")?,
        held_until: row.try_get("held_until")?,
        lost_at: row.try_get("lost_at")?,
    })
}

impl Store {
    /// Links a provider account of the tenant's own organisation (again: nothing changes).
    pub async fn link_own_provider(&self, tenant_id: i64, provider_id: i64, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO own_providers (tenant_id, provider_id, linked_at) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id, provider_id) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(provider_id)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Unlinks one; false when it was not linked.
    pub async fn unlink_own_provider(&self, tenant_id: i64, provider_id: i64) -> Result<bool> {
        let done = sqlx::query("DELETE FROM own_providers WHERE tenant_id = $1 AND provider_id = $2")
            .bind(tenant_id)
            .bind(provider_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// One tenant's links: (provider, linked at), by provider.
    pub async fn own_providers_of(&self, tenant_id: i64) -> Result<Vec<(i64, i64)>> {
        let rows =
            sqlx::query("SELECT provider_id, linked_at FROM own_providers WHERE tenant_id = $1 ORDER BY provider_id")
                .bind(tenant_id)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("provider_id")?, row.try_get("linked_at")?)))
            .collect()
    }

    /// Every link: (tenant, provider, linked at), by tenant then provider.
    pub async fn own_provider_links(&self) -> Result<Vec<(i64, i64, i64)>> {
        let rows =
            sqlx::query("SELECT tenant_id, provider_id, linked_at FROM own_providers ORDER BY tenant_id, provider_id")
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get("tenant_id")?,
                    row.try_get("provider_id")?,
                    row.try_get("linked_at")?,
                ))
            })
            .collect()
    }
}
