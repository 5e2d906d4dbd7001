//! Nodes: registration, policies, heartbeats (batched), liveness, and the nonces of signed
//! requests (so a replay is refused by every replica, not only the one that saw it first).

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::accounts::is_unique_violation;
use crate::{Heartbeat, NewNode, NodeRecord, NodesVersion, OnlineChange, OverLimitChange, Result, Store, StoreError};

/// Heartbeats per `UPDATE` (four parameters each; SQLite allows 32,766 in a statement).
const HEARTBEATS_PER_STATEMENT_MAX: usize = 512;
/// Nonces per `INSERT` (three parameters each).
const NONCES_PER_STATEMENT_MAX: usize = 256;

const NODE_COLUMNS: &str = "id, provider_id, name, public_key, fingerprint, fingerprint_changed_at, region, site, \
    fabric, nvlink_domain, latitude, longitude, gpu_model, gpu_count, cpu_milli, memory_mib, network_mbit_s, \
    simulated, policy, datasets, registered_at, updated_at, last_heartbeat_at, online, telemetry, over_limit_since, runtimes, fraud_cordoned_at, \
    advertise_addr, gang_ports, nvlink_source, nvlink_detected, location_source, reclaim_gpu_mask, reclaim_until";

fn node_from(row: &AnyRow) -> Result<NodeRecord> {
    Ok(NodeRecord {
        id: row.try_get("id")?,
        node: NewNode {
            provider_id: row.try_get("provider_id")?,
            name: row.try_get("name")?,
            public_key: row.try_get("public_key")?,
            fingerprint: row.try_get("fingerprint")?,
            region: row.try_get("region")?,
            site: row.try_get("site")?,
            fabric: row.try_get("fabric")?,
            nvlink_domain: row.try_get("nvlink_domain")?,
            latitude: row.try_get("latitude")?,
            longitude: row.try_get("longitude")?,
            gpu_model: row.try_get("gpu_model")?,
            gpu_count: row.try_get("gpu_count")?,
            cpu_milli: row.try_get("cpu_milli")?,
            memory_mib: row.try_get("memory_mib")?,
            network_mbit_s: row.try_get("network_mbit_s")?,
            simulated: row.try_get::<i64, _>("simulated")? != 0,
            policy: row.try_get("policy")?,
            datasets: row.try_get("datasets")?,
            runtimes: row.try_get("runtimes")?,
            advertise_addr: row.try_get("advertise_addr")?,
            gang_ports: row.try_get("gang_ports")?,
            nvlink_source: row.try_get("nvlink_source")?,
            nvlink_detected: row.try_get("nvlink_detected")?,
            location_source: row.try_get("location_source")?,
        },
        fingerprint_changed_at: row.try_get("fingerprint_changed_at")?,
        registered_at: row.try_get("registered_at")?,
        updated_at: row.try_get("updated_at")?,
        last_heartbeat_at: row.try_get("last_heartbeat_at")?,
        online: row.try_get::<i64, _>("online")? != 0,
        telemetry: row.try_get("telemetry")?,
        over_limit_since: row.try_get("over_limit_since")?,
        fraud_cordoned_at: row.try_get("fraud_cordoned_at")?,
        reclaim_gpu_mask: row.try_get("reclaim_gpu_mask")?,
        reclaim_until: row.try_get("reclaim_until")?,
    })
}

/// The columns `insert_node` writes, and the parameters of one row: `$19` is both
/// `registered_at` and `updated_at`, and `online` starts at 0.
const INSERT_NODE_COLUMNS: &str = "provider_id, name, public_key, fingerprint, region, site, fabric, nvlink_domain, \
     latitude, longitude, gpu_model, gpu_count, cpu_milli, memory_mib, network_mbit_s, simulated, policy, \
     datasets, registered_at, updated_at, online, runtimes, advertise_addr, gang_ports, nvlink_source, \
     nvlink_detected, location_source";
const INSERT_NODE_PARAMETERS: usize = 25;
/// `($1, …, $25)` for the `row`-th row of an insert, as `bind_node` binds them.
fn insert_node_values(row: usize) -> String {
    let p = |n: usize| format!("${}", row * INSERT_NODE_PARAMETERS + n);
    let mut values: Vec<String> = (1..=19).map(p).collect();
    values.push(p(19));
    values.push("0".to_string());
    values.extend((20..=25).map(p));
    format!("({})", values.join(", "))
}

fn bind_node<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    node: &'q NewNode,
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    query
        .bind(node.provider_id)
        .bind(&node.name)
        .bind(&node.public_key)
        .bind(&node.fingerprint)
        .bind(&node.region)
        .bind(&node.site)
        .bind(&node.fabric)
        .bind(&node.nvlink_domain)
        .bind(node.latitude)
        .bind(node.longitude)
        .bind(&node.gpu_model)
        .bind(node.gpu_count)
        .bind(node.cpu_milli)
        .bind(node.memory_mib)
        .bind(node.network_mbit_s)
        .bind(i64::from(node.simulated))
        .bind(&node.policy)
        .bind(&node.datasets)
        .bind(now)
        .bind(&node.runtimes)
        .bind(&node.advertise_addr)
        .bind(&node.gang_ports)
        .bind(&node.nvlink_source)
        .bind(&node.nvlink_detected)
        .bind(&node.location_source)
}

fn node_conflict(error: sqlx::Error, node: &NewNode) -> StoreError {
    if is_unique_violation(&error) {
        StoreError::Conflict(format!("node {:?} of this provider, or its public key,", node.name))
    } else {
        error.into()
    }
}

/// A node as `insert_node` leaves it: registered, never heard from.
fn new_node_record(id: i64, node: &NewNode, now: i64) -> NodeRecord {
    NodeRecord {
        id,
        node: node.clone(),
        fingerprint_changed_at: None,
        registered_at: now,
        updated_at: now,
        last_heartbeat_at: None,
        online: false,
        telemetry: None,
        over_limit_since: None,
        fraud_cordoned_at: None,
        reclaim_gpu_mask: 0,
        reclaim_until: None,
    }
}

impl Store {
    pub async fn insert_node(&self, node: &NewNode, now: i64) -> Result<NodeRecord> {
        let query = format!(
            "INSERT INTO nodes ({INSERT_NODE_COLUMNS}) VALUES {} RETURNING id",
            insert_node_values(0)
        );
        let row = bind_node(sqlx::query(sqlx::AssertSqlSafe(query)), node, now)
            .fetch_one(&self.pool)
            .await
            .map_err(|error| node_conflict(error, node))?;
        Ok(new_node_record(row.try_get("id")?, node, now))
    }

    /// Registers `nodes` in one transaction, all or none (a conflict names the node that met
    /// it), and returns them in the order given. One `INSERT` a node, the statement prepared
    /// once: sqlx finds each `$N` of a statement by name among all of them, so a multi-row
    /// `INSERT` of 500 nodes (12,500 parameters) spent its time there.
    pub async fn insert_nodes(&self, nodes: &[NewNode], now: i64) -> Result<Vec<NodeRecord>> {
        let query = format!(
            "INSERT INTO nodes ({INSERT_NODE_COLUMNS}) VALUES {} RETURNING id",
            insert_node_values(0)
        );
        let mut transaction = self.begin_write().await?;
        let mut records = Vec::with_capacity(nodes.len());
        for node in nodes {
            let row = bind_node(sqlx::query(sqlx::AssertSqlSafe(query.clone())), node, now)
                .fetch_one(&mut *transaction)
                .await
                .map_err(|error| node_conflict(error, node))?;
            records.push(new_node_record(row.try_get("id")?, node, now));
        }
        transaction.commit().await?;
        Ok(records)
    }

    pub async fn node(&self, id: i64) -> Result<Option<NodeRecord>> {
        let query = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(node_from).transpose()
    }

    /// Every node, in id order: what the matcher is rebuilt from.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let query = format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query)).fetch_all(&self.pool).await?;
        rows.iter().map(node_from).collect()
    }

    /// The nodes with an id above `after` and up to `up_to`, in id order: those registered
    /// since a view holding every node up to `after` was built (the primary key's range).
    pub async fn nodes_between(&self, after: i64, up_to: i64) -> Result<Vec<NodeRecord>> {
        let query = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id > $1 AND id <= $2 ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(after)
            .bind(up_to)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(node_from).collect()
    }

    /// Nodes that declare the NVLink domain `domain` of `site` and `fabric`, or that NVML put in
    /// the multi-node fabric `detected` (`nvl-…`): what a registration's domain is checked against.
    pub async fn nodes_sharing_nvlink(
        &self,
        site: &str,
        fabric: &str,
        domain: &str,
        detected: &str,
    ) -> Result<Vec<NodeRecord>> {
        let query = format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE (site = $1 AND fabric = $2 AND nvlink_domain = $3 AND $3 <> '') \
             OR (nvlink_detected = $4 AND $4 LIKE 'nvl-%') ORDER BY id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(site)
            .bind(fabric)
            .bind(domain)
            .bind(detected)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(node_from).collect()
    }

    pub async fn nodes_of_provider(&self, provider_id: i64) -> Result<Vec<NodeRecord>> {
        let query = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE provider_id = $1 ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(provider_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(node_from).collect()
    }

    /// The highest `updated_at` and the highest id over all nodes: the matcher rebuilds
    /// when either changes (a registration, a policy, a fingerprint or the datasets held, not
    /// a node going on or off line: see `online_changes_since`).
    pub async fn nodes_version(&self) -> Result<NodesVersion> {
        // Two single-aggregate subqueries, so each is one index lookup (nodes are never deleted:
        // the highest id stands for the count).
        let row = sqlx::query(
            "SELECT (SELECT CAST(COALESCE(MAX(updated_at), 0) AS BIGINT) FROM nodes) AS version, \
             (SELECT CAST(COALESCE(MAX(id), 0) AS BIGINT) FROM nodes) AS count",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(NodesVersion {
            updated_at: row.try_get("version")?,
            highest_id: row.try_get("count")?,
        })
    }

    /// Whether any node with an id up to `highest_id` changed after `updated_at`: false when
    /// all that moved `nodes_version` since a view was built at (`updated_at`, `highest_id`)
    /// is nodes registered since. Reads only the rows changed since (the `updated_at` index).
    pub async fn nodes_changed_since(&self, since: NodesVersion) -> Result<bool> {
        let row = sqlx::query(
            "SELECT CAST(COUNT(*) AS BIGINT) AS changed FROM \
             (SELECT 1 FROM nodes WHERE updated_at > $1 AND id <= $2 LIMIT 1) AS found",
        )
        .bind(since.updated_at)
        .bind(since.highest_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>("changed")? > 0)
    }

    /// Replaces a node's policy (JSON); false when the node does not exist.
    pub async fn set_node_policy(&self, id: i64, policy: &str, now: i64) -> Result<bool> {
        let done = sqlx::query("UPDATE nodes SET policy = $1, updated_at = $2 WHERE id = $3")
            .bind(policy)
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Restates what a node's agent says of it on start (`node`'s name, place, NVLink domain,
    /// coordinates, gang address and ports, runtimes, and its policy): the rest (key, GPUs,
    /// fingerprint) stays. False when the node does not exist; a name another node of the
    /// provider has is a conflict.
    pub async fn restate_node(&self, id: i64, node: &NewNode, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET name = $1, region = $2, site = $3, fabric = $4, nvlink_domain = $5, \
             nvlink_source = $6, nvlink_detected = $7, latitude = $8, longitude = $9, location_source = $10, \
             advertise_addr = $11, gang_ports = $12, runtimes = $13, policy = $14, updated_at = $15 WHERE id = $16",
        )
        .bind(&node.name)
        .bind(&node.region)
        .bind(&node.site)
        .bind(&node.fabric)
        .bind(&node.nvlink_domain)
        .bind(&node.nvlink_source)
        .bind(&node.nvlink_detected)
        .bind(node.latitude)
        .bind(node.longitude)
        .bind(&node.location_source)
        .bind(&node.advertise_addr)
        .bind(&node.gang_ports)
        .bind(&node.runtimes)
        .bind(&node.policy)
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(|error| node_conflict(error, node))?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a new hardware fingerprint; returns whether it changed.
    pub async fn set_node_fingerprint(&self, id: i64, fingerprint: &str, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET fingerprint = $1, fingerprint_changed_at = $2, updated_at = $2 \
             WHERE id = $3 AND fingerprint <> $1",
        )
        .bind(fingerprint)
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a batch of heartbeats in one transaction (group commit). A node that was offline
    /// comes back online (`online_changed_at` moves); new datasets move `updated_at`; a node
    /// within its limits that the store has over them since before the heartbeat is cleared
    /// (`over_limit_changed_at` moves): a later heartbeat that said "over" is not undone.
    ///
    /// Each change is its own statement that assigns only what it changes: SQLite rewrites an
    /// index whenever an `UPDATE` assigns one of its columns, changed or not, so one statement
    /// assigning all of them (through `CASE`) cost 1.6–1.7× the time of these three (512 rows:
    /// 33–36 ms against 20 ms). The first two touch only the rare rows that need them.
    pub async fn record_heartbeats(&self, beats: &[Heartbeat]) -> Result<()> {
        if beats.is_empty() {
            return Ok(());
        }
        // One statement per change for the batch: per statement, sqlx's round trip to SQLite's
        // worker thread cost more than the update itself.
        let mut transaction = self.begin_write().await?;
        for chunk in beats.chunks(HEARTBEATS_PER_STATEMENT_MAX) {
            let query = update_nodes_from_values(
                &[("id", "BIGINT"), ("at", "BIGINT")],
                chunk.len(),
                "online = 1, online_changed_at = v.at",
                "nodes.online = 0",
            );
            let mut update = sqlx::query(sqlx::AssertSqlSafe(query));
            for beat in chunk {
                update = update.bind(beat.node_id).bind(beat.at);
            }
            update.execute(&mut *transaction).await?;
            let with_datasets: Vec<&Heartbeat> = chunk.iter().filter(|beat| beat.datasets.is_some()).collect();
            if !with_datasets.is_empty() {
                let query = update_nodes_from_values(
                    &[("id", "BIGINT"), ("at", "BIGINT"), ("datasets", "TEXT")],
                    with_datasets.len(),
                    "datasets = v.datasets, updated_at = v.at",
                    "nodes.datasets <> v.datasets",
                );
                let mut update = sqlx::query(sqlx::AssertSqlSafe(query));
                for beat in with_datasets {
                    update = update.bind(beat.node_id).bind(beat.at).bind(beat.datasets.as_deref());
                }
                update.execute(&mut *transaction).await?;
            }
            let within: Vec<&Heartbeat> = chunk.iter().filter(|beat| beat.within_limits).collect();
            if !within.is_empty() {
                let query = update_nodes_from_values(
                    &[("id", "BIGINT"), ("at", "BIGINT")],
                    within.len(),
                    "over_limit_since = NULL, over_limit_changed_at = v.at",
                    "nodes.over_limit_since IS NOT NULL AND nodes.over_limit_since < v.at",
                );
                let mut update = sqlx::query(sqlx::AssertSqlSafe(query));
                for beat in within {
                    update = update.bind(beat.node_id).bind(beat.at);
                }
                update.execute(&mut *transaction).await?;
            }
            let query = update_nodes_from_values(
                &[("id", "BIGINT"), ("at", "BIGINT"), ("telemetry", "TEXT")],
                chunk.len(),
                "last_heartbeat_at = v.at, telemetry = v.telemetry",
                "TRUE",
            );
            let mut update = sqlx::query(sqlx::AssertSqlSafe(query));
            for beat in chunk {
                update = update.bind(beat.node_id).bind(beat.at).bind(&beat.telemetry);
            }
            update.execute(&mut *transaction).await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    /// Replaces a node's public key, if it is still `old` (a rotation signed by the old key).
    /// False when the node's key is no longer `old`; `Conflict` when another node has `new`.
    pub async fn rotate_node_key(&self, id: i64, old: &str, new: &str, now: i64) -> Result<bool> {
        let done =
            sqlx::query("UPDATE nodes SET public_key = $1, key_rotated_at = $2 WHERE id = $3 AND public_key = $4")
                .bind(new)
                .bind(now)
                .bind(id)
                .bind(old)
                .execute(&self.pool)
                .await
                .map_err(|error| {
                    if crate::accounts::is_unique_violation(&error) {
                        StoreError::Conflict("a node with this public key".to_string())
                    } else {
                        error.into()
                    }
                })?;
        Ok(done.rows_affected() == 1)
    }

    /// Nodes whose key was rotated at or after `since`, by id. Sorted here: with `ORDER BY id`
    /// SQLite walked the whole table in id order rather than the `key_rotated_at` index (111 ms
    /// a look at 125,000 nodes, once a second).
    pub async fn keys_rotated_since(&self, since: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT id FROM nodes WHERE key_rotated_at >= $1")
            .bind(since)
            .fetch_all(&self.pool)
            .await?;
        let mut ids = rows
            .iter()
            .map(|row| Ok(row.try_get("id")?))
            .collect::<Result<Vec<i64>>>()?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Online nodes whose last heartbeat is older than `cutoff`.
    pub async fn silent_nodes(&self, cutoff: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM nodes WHERE online = 1 AND (last_heartbeat_at IS NULL OR last_heartbeat_at < $1) ORDER BY id",
        )
        .bind(cutoff)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    pub async fn set_node_offline(&self, id: i64, now: i64) -> Result<bool> {
        let done = sqlx::query("UPDATE nodes SET online = 0, online_changed_at = $1 WHERE id = $2 AND online = 1")
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Remembers the nonces of signed requests, all in one transaction; for each, whether it
    /// was new (false: a replay, also of an earlier one in the same batch).
    ///
    /// One multi-row `INSERT` per `NONCES_PER_STATEMENT_MAX`: one statement a nonce held the
    /// writers' turn for half of each second at 10,000 heartbeats a second, each statement a
    /// round trip to SQLite's thread.
    pub async fn remember_nonces(&self, nonces: &[(i64, String, i64)]) -> Result<Vec<bool>> {
        let mut fresh = Vec::with_capacity(nonces.len());
        if nonces.is_empty() {
            return Ok(fresh);
        }
        let mut transaction = self.begin_write().await?;
        for chunk in nonces.chunks(NONCES_PER_STATEMENT_MAX) {
            let query = format!(
                "INSERT INTO nonces (node_id, nonce, seen_at) VALUES {} \
                 ON CONFLICT (node_id, nonce) DO NOTHING RETURNING node_id, nonce",
                crate::values_rows(chunk.len(), &["", "", ""])
            );
            let mut insert = sqlx::query(sqlx::AssertSqlSafe(query));
            for (node_id, nonce, at) in chunk {
                insert = insert.bind(*node_id).bind(nonce).bind(*at);
            }
            let mut inserted: std::collections::HashSet<(i64, String)> = insert
                .fetch_all(&mut *transaction)
                .await?
                .iter()
                .map(|row| Ok((row.try_get("node_id")?, row.try_get("nonce")?)))
                .collect::<Result<_>>()?;
            // A nonce twice in the batch was inserted once: the first is new, the second a replay.
            for (node_id, nonce, _) in chunk {
                fresh.push(inserted.remove(&(*node_id, nonce.clone())));
            }
        }
        transaction.commit().await?;
        Ok(fresh)
    }

    /// Forgets nonces seen before `cutoff`: older requests are refused as stale anyway.
    pub async fn forget_nonces_before(&self, cutoff: i64) -> Result<u64> {
        let done = sqlx::query("DELETE FROM nonces WHERE seen_at < $1")
            .bind(cutoff)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Marks a node over its owner's limits since `now` (`over`), or back within them; returns
    /// whether that changed anything. A change moves `over_limit_changed_at` (see
    /// `over_limit_changes_since`).
    pub async fn set_node_over_limit(&self, id: i64, over: bool, now: i64) -> Result<bool> {
        let query = if over {
            "UPDATE nodes SET over_limit_since = $1, over_limit_changed_at = $1 WHERE id = $2 AND over_limit_since IS NULL"
        } else {
            "UPDATE nodes SET over_limit_since = NULL, over_limit_changed_at = $1 WHERE id = $2 AND over_limit_since IS NOT NULL"
        };
        let done = sqlx::query(query).bind(now).bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() == 1)
    }

    /// Sets a node's reclaim: the GPUs of `gpu_mask` (0: none, the node is resumed) are its
    /// owner's until `until` (`None`: until resumed). Moves `updated_at`, so the leader's view is
    /// built again with them held. False when the node does not exist.
    pub async fn set_node_reclaim(&self, id: i64, gpu_mask: i64, until: Option<i64>, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET reclaim_gpu_mask = $1, reclaim_until = $2, \
             updated_at = CASE WHEN updated_at >= $3 THEN updated_at + 1 ELSE $3 END WHERE id = $4",
        )
        .bind(gpu_mask)
        .bind(if gpu_mask == 0 { None } else { until })
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Ends the reclaims whose time is up at `now`; returns the nodes resumed, in id order.
    pub async fn end_expired_reclaims(&self, now: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM nodes WHERE reclaim_gpu_mask <> 0 AND reclaim_until IS NOT NULL \
             AND reclaim_until <= $1 ORDER BY id",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        let mut resumed = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            // Only if no new reclaim replaced it meanwhile.
            let done = sqlx::query(
                "UPDATE nodes SET reclaim_gpu_mask = 0, reclaim_until = NULL, \
                 updated_at = CASE WHEN updated_at >= $1 THEN updated_at + 1 ELSE $1 END \
                 WHERE id = $2 AND reclaim_until IS NOT NULL AND reclaim_until <= $1",
            )
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
            if done.rows_affected() == 1 {
                resumed.push(id);
            }
        }
        Ok(resumed)
    }

    /// Nodes whose over-limit state changed at or after `since`.
    pub async fn over_limit_changes_since(&self, since: i64) -> Result<Vec<OverLimitChange>> {
        let rows = sqlx::query(
            "SELECT id, over_limit_since, over_limit_changed_at FROM nodes \
             WHERE over_limit_changed_at >= $1 ORDER BY over_limit_changed_at, id",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(OverLimitChange {
                    node_id: row.try_get("id")?,
                    over_limit_since: row.try_get("over_limit_since")?,
                    changed_at: row.try_get("over_limit_changed_at")?,
                })
            })
            .collect()
    }

    /// Nodes over their owner's limits since `before` or earlier, in id order.
    pub async fn nodes_over_limit_since(&self, before: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM nodes WHERE over_limit_since IS NOT NULL AND over_limit_since <= $1 ORDER BY id",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Nodes whose online state changed at or after `since`.
    pub async fn online_changes_since(&self, since: i64) -> Result<Vec<OnlineChange>> {
        let rows = sqlx::query(
            "SELECT id, online, online_changed_at FROM nodes WHERE online_changed_at >= $1 ORDER BY online_changed_at, id",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(OnlineChange {
                    node_id: row.try_get("id")?,
                    online: row.try_get::<i64, _>("online")? != 0,
                    changed_at: row.try_get("online_changed_at")?,
                })
            })
            .collect()
    }
}

/// An `UPDATE` of the nodes named in a list of rows (`columns`: name and type of each value,
/// the first the node's id), setting `set` where `condition` holds, with `v` the row of the
/// node. The nodes are found by `nodes.id IN (SELECT id FROM v)`: with only the join's
/// `nodes.id = v.id` SQLite 3.51 chose to scan every node and probe the list (82 ms for 512
/// rows of 125,000 nodes, against 6 ms by id).
fn update_nodes_from_values(columns: &[(&str, &str)], rows: usize, set: &str, condition: &str) -> String {
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let types: Vec<&str> = columns.iter().map(|(_, kind)| *kind).collect();
    format!(
        "WITH v({}) AS (VALUES {}) UPDATE nodes SET {set} FROM v \
         WHERE nodes.id IN (SELECT id FROM v) AND nodes.id = v.id AND {condition}",
        names.join(", "),
        crate::values_rows(rows, &types)
    )
}
