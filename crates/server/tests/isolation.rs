//! Parties are isolated, on SQLite and on PostgreSQL: a tenant sees and cancels only its own
//! jobs, a provider only its own nodes, a node reports only on its own leases (the attempt is
//! evidence), each role's key opens only its role's endpoints, and revoked or rotated keys
//! stop working at once.

mod common;

use common::{Harness, case, job_request, on_every_backend, run_until_placed};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_read_list_or_cancel_another_tenants_job() {
    on_every_backend(async |h: &Harness| {
        let owner = h.tenant("acme").await;
        let intruder = h.tenant("globex").await;
        h.credit(&owner, "10.00").await;
        h.credit(&intruder, "10.00").await;
        let job = h.submit(&owner, job_request("private")).await;
        let own = h.submit(&intruder, job_request("theirs")).await;
        let id = &job["id"];
        let before = h
            .get(&owner.key, &format!("/v1/jobs/{id}"))
            .await
            .expect(200, "owner reads");

        let missing = h.get(&intruder.key, "/v1/jobs/987654321").await;
        let foreign = h.get(&intruder.key, &format!("/v1/jobs/{id}")).await;
        assert_eq!(
            (
                foreign.status,
                foreign.refused(404, "read another's job").replace(&id.to_string(), "N")
            ),
            (
                missing.status,
                missing.refused(404, "read a missing job").replace("987654321", "N")
            ),
            "{}: another tenant's job answers exactly as a missing one",
            h.backend
        );
        h.post(&intruder.key, &format!("/v1/jobs/{id}/cancel"), json!({}))
            .await
            .refused(404, "cancel another's job");
        let after = h
            .get(&owner.key, &format!("/v1/jobs/{id}"))
            .await
            .expect(200, "owner reads");
        // The reconcile loop may note why the job waits; nothing else about it may change.
        let owned = |view: &Value| {
            [
                "id",
                "tenant_id",
                "state",
                "spec",
                "leases",
                "cost_micros",
                "escrow_micros",
            ]
            .map(|field| view[field].clone())
        };
        assert_eq!(owned(&after), owned(&before), "{}: the job is untouched", h.backend);
        assert_eq!(after["state"], "queued", "{}", h.backend);

        let listed = h.get(&intruder.key, "/v1/jobs").await.expect(200, "list");
        let ids: Vec<&Value> = listed["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|job| &job["id"])
            .collect();
        assert_eq!(ids, [&own["id"]], "{}: a tenant lists only its own jobs", h.backend);
        let listed = h.get(&owner.key, "/v1/jobs").await.expect(200, "list");
        assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1), "{}", h.backend);

        // Nor its money, statement or keys.
        h.check(&[
            case(
                "balance",
                &intruder.key,
                "GET",
                &format!("/v1/balance?account_id={}", owner.id),
                None,
                404,
            ),
            case(
                "statement",
                &intruder.key,
                "GET",
                &format!("/v1/statement?account_id={}", owner.id),
                None,
                404,
            ),
            case(
                "keys",
                &intruder.key,
                "GET",
                &format!("/v1/accounts/{}/keys", owner.id),
                None,
                404,
            ),
            case(
                "new key",
                &intruder.key,
                "POST",
                &format!("/v1/accounts/{}/keys", owner.id),
                Some(json!({"label": "mine now"})),
                404,
            ),
            case(
                "revoke",
                &intruder.key,
                "POST",
                &format!("/v1/keys/{}/revoke", owner.key_id),
                None,
                404,
            ),
        ])
        .await;
        h.get(&owner.key, "/v1/jobs")
            .await
            .expect(200, "the owner's key still works");
        let keys = h
            .get(&owner.key, &format!("/v1/accounts/{}/keys", owner.id))
            .await
            .expect(200, "keys");
        assert_eq!(
            keys.as_array().map(Vec::len),
            Some(1),
            "{}: no key was added: {keys}",
            h.backend
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_cannot_see_or_change_another_providers_node() {
    on_every_backend(async |h: &Harness| {
        let owner = h.provider("gpu-farm").await;
        let intruder = h.provider("rival").await;
        let node = h.node(&owner, "node1", |_| {}).await;
        let theirs = h.node(&intruder, "their-node", |_| {}).await;
        let path = format!("/v1/nodes/{}", node.node_id);
        let before = h.get(&owner.key, &path).await.expect(200, "owner reads its node");

        h.get(&intruder.key, &path).await.refused(404, "read another's node");
        let cheaper = json!({"asks": {"gold": "0.01"}});
        h.put(&intruder.key, &format!("{path}/policy"), cheaper.clone())
            .await
            .refused(404, "change another's policy");
        let after = h.get(&owner.key, &path).await.expect(200, "owner reads its node");
        assert_eq!(
            after["policy"], before["policy"],
            "{}: the policy is untouched",
            h.backend
        );
        assert_eq!(after["policy"]["asks"]["gold"], "3.00", "{}", h.backend);

        let listed = h.get(&intruder.key, "/v1/nodes").await.expect(200, "list");
        let ids: Vec<&Value> = listed
            .as_array()
            .expect("nodes")
            .iter()
            .map(|node| &node["id"])
            .collect();
        assert_eq!(
            ids,
            [&json!(theirs.node_id)],
            "{}: a provider lists only its own nodes",
            h.backend
        );
        let earnings = h.get(&intruder.key, "/v1/earnings").await.expect(200, "earnings");
        assert_eq!(earnings["nodes"].as_array().map(Vec::len), Some(1), "{}", h.backend);

        // The owner can change it: the refusal above was about who asked.
        let changed = h
            .put(&owner.key, &format!("{path}/policy"), cheaper)
            .await
            .expect(200, "owner changes its policy");
        assert_eq!(changed["policy"]["asks"]["gold"], "0.01", "{}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cannot_report_for_a_lease_another_node_holds() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let owner = h.provider("gpu-farm").await;
        let rival = h.provider("rival").await;
        h.credit(&tenant, "10.00").await;
        let holder = h.node(&owner, "holder", |_| {}).await;
        let job = h.submit(&tenant, job_request("watched")).await;
        let job_id = job["id"].as_i64().unwrap();
        let (_, lease) = run_until_placed(h, &holder, &tenant, job_id).await;
        // Registered after the placement, so they hold nothing.
        let stranger = h.node(&rival, "stranger", |_| {}).await;
        let sibling = h.node(&owner, "sibling", |_| {}).await;

        let event = json!({"epoch": lease["epoch"], "state": "failed", "detail": "sabotage"});
        let event_path = format!("/v1/agent/leases/{}/events", lease["id"]);
        for intruder in [&stranger, &sibling] {
            let attempts = [
                ("event", intruder.signed("POST", &event_path, Some(&event)).await),
                (
                    "usage",
                    intruder
                        .signed("POST", "/v1/agent/usage", Some(&intruder.usage(&lease, 1, 1000)))
                        .await,
                ),
                (
                    "attestation",
                    intruder
                        .signed("POST", "/v1/agent/attestations", Some(&intruder.attestation(&lease, 0)))
                        .await,
                ),
            ];
            for (what, reply) in attempts {
                let message = reply.refused(403, &format!("node {} reports {what}", intruder.node_id));
                assert!(message.contains("recorded"), "{}: {message}", h.backend);
            }
            let evidence = h.evidence().await;
            let recorded = evidence
                .iter()
                .filter(|row| {
                    row["node_id"] == intruder.node_id
                        && (row["kind"] == "foreign_lease" || row["kind"] == "foreign_lease_record")
                })
                .count();
            assert_eq!(recorded, 3, "{}: every attempt is evidence: {evidence:?}", h.backend);
        }
        assert!(!h.has_evidence(holder.node_id, "foreign_lease").await, "{}", h.backend);

        let view = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
            .await
            .expect(200, "job");
        assert_eq!(view["state"], "running", "{}: {view}", h.backend);
        assert_eq!(view["leases"][0]["state"], "pending", "{}", h.backend);
        assert_eq!(view["cost_micros"], 0, "{}: nothing billed", h.backend);
        // The holder still can: its lease took no harm.
        holder.event(&lease, "running").await.expect(200, "the holder reports");
        let accepted = holder
            .signed("POST", "/v1/agent/usage", Some(&holder.usage(&lease, 1, 1000)))
            .await
            .expect(200, "the holder's usage");
        assert_eq!(accepted["new"], true, "{}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_key_opens_only_its_roles_endpoints() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        h.credit(&tenant, "10.00").await;
        let node = h.node(&provider, "node1", |_| {}).await;
        let registration = common::node_registration(&trust::NodeKey::generate(), "sneaky");
        let account = json!({"role": "admin", "name": "mallory"});
        let credit = json!({"account_id": tenant.id, "amount": "1000.00", "key": "free-money"});
        let policy = json!({"asks": {"gold": "9.00"}});
        let node_path = format!("/v1/nodes/{}", node.node_id);
        let policy_path = format!("{node_path}/policy");
        let job = Some(job_request("x"));
        let admin = h.admin.clone();
        let (t, p, a) = (tenant.key.as_str(), provider.key.as_str(), admin.as_str());
        let before = h.snapshot().await;
        h.check(&[
            // Tenant keys on provider and admin endpoints.
            case(
                "tenant registers a node",
                t,
                "POST",
                "/v1/nodes",
                Some(registration.clone()),
                403,
            ),
            case("tenant lists nodes", t, "GET", "/v1/nodes", None, 403),
            case(
                "tenant sets a policy",
                t,
                "PUT",
                &policy_path,
                Some(policy.clone()),
                403,
            ),
            case("tenant reads earnings", t, "GET", "/v1/earnings", None, 403),
            case(
                "tenant makes an account",
                t,
                "POST",
                "/v1/admin/accounts",
                Some(account.clone()),
                403,
            ),
            case("tenant lists accounts", t, "GET", "/v1/admin/accounts", None, 403),
            case(
                "tenant credits itself",
                t,
                "POST",
                "/v1/admin/credits",
                Some(credit.clone()),
                403,
            ),
            case("tenant reads evidence", t, "GET", "/v1/admin/evidence", None, 403),
            // Provider keys on tenant and admin endpoints.
            case("provider submits a job", p, "POST", "/v1/jobs", job.clone(), 403),
            case("provider lists jobs", p, "GET", "/v1/jobs", None, 403),
            case("provider quotes", p, "POST", "/v1/jobs/quote", job.clone(), 403),
            case(
                "provider makes an account",
                p,
                "POST",
                "/v1/admin/accounts",
                Some(account.clone()),
                403,
            ),
            case("provider lists accounts", p, "GET", "/v1/admin/accounts", None, 403),
            case(
                "provider credits",
                p,
                "POST",
                "/v1/admin/credits",
                Some(credit.clone()),
                403,
            ),
            case("provider reads evidence", p, "GET", "/v1/admin/evidence", None, 403),
            // Admin keys on tenant and provider endpoints that act as that party.
            case("admin submits a job", a, "POST", "/v1/jobs", job.clone(), 403),
            case("admin lists its jobs", a, "GET", "/v1/jobs", None, 403),
            case(
                "admin registers a node",
                a,
                "POST",
                "/v1/nodes",
                Some(registration.clone()),
                403,
            ),
            case("admin reads earnings", a, "GET", "/v1/earnings", None, 403),
            // API keys do not sign agent requests.
            case(
                "tenant heartbeats",
                t,
                "POST",
                "/v1/agent/heartbeat",
                Some(json!({})),
                401,
            ),
        ])
        .await;
        assert_eq!(h.snapshot().await, before, "{}: refusals wrote nothing", h.backend);
        let money = h.get(&tenant.key, "/v1/balance").await.expect(200, "balance");
        assert_eq!(money["available_micros"], 10_000_000, "{}", h.backend);
        let node_now = h.get(&provider.key, &node_path).await.expect(200, "node");
        assert_eq!(node_now["policy"]["asks"]["gold"], "3.00", "{}", h.backend);

        // And each role's own endpoints answer, so the refusals above are about the role.
        h.check(&[
            case("tenant lists jobs", t, "GET", "/v1/jobs", None, 200),
            case("tenant quotes", t, "POST", "/v1/jobs/quote", job.clone(), 200),
            case("provider lists nodes", p, "GET", "/v1/nodes", None, 200),
            case("provider reads earnings", p, "GET", "/v1/earnings", None, 200),
            case("admin lists accounts", a, "GET", "/v1/admin/accounts", None, 200),
            case("admin reads evidence", a, "GET", "/v1/admin/evidence", None, 200),
            case("admin reads any node", a, "GET", &node_path, None, 200),
        ])
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_key_stops_working_at_once() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let keys_path = format!("/v1/accounts/{}/keys", tenant.id);
        let second = h
            .post(&tenant.key, &keys_path, json!({"label": "ci"}))
            .await
            .expect(201, "a second key");
        let second_key = second["api_key"].as_str().unwrap().to_string();
        let second_id = second["key_id"].as_str().unwrap().to_string();
        // Used once, so it sits in the server's key cache when it is revoked.
        h.get(&second_key, "/v1/jobs").await.expect(200, "the new key works");

        h.call("POST", &format!("/v1/keys/{second_id}/revoke"), Some(&tenant.key), None)
            .await
            .expect(204, "revoke");
        let message = h.get(&second_key, "/v1/jobs").await.refused(401, "the revoked key");
        assert!(message.contains("revoked"), "{}: {message}", h.backend);
        h.call("POST", &format!("/v1/keys/{second_id}/revoke"), Some(&tenant.key), None)
            .await
            .refused(409, "revoking twice");
        h.get(&tenant.key, "/v1/jobs")
            .await
            .expect(200, "the first key still works");
        let keys = h.get(&tenant.key, &keys_path).await.expect(200, "keys");
        let revoked = keys
            .as_array()
            .expect("keys")
            .iter()
            .find(|key| key["key_id"] == second_id.as_str())
            .expect("the revoked key is listed");
        assert!(revoked["revoked_at_us"].is_i64(), "{}: {revoked}", h.backend);

        // An admin revokes a provider's key the same way.
        let provider = h.provider("gpu-farm").await;
        h.get(&provider.key, "/v1/nodes")
            .await
            .expect(200, "provider key works");
        h.call(
            "POST",
            &format!("/v1/keys/{}/revoke", provider.key_id),
            Some(&h.admin),
            None,
        )
        .await
        .expect(204, "admin revokes");
        h.get(&provider.key, "/v1/nodes")
            .await
            .refused(401, "the revoked provider key");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotating_a_key_gives_a_working_key_and_kills_the_old_one() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        h.get(&tenant.key, "/v1/jobs").await.expect(200, "the old key works");
        let fresh = h
            .call("POST", "/v1/keys/rotate", Some(&tenant.key), None)
            .await
            .expect(201, "rotate");
        let fresh_key = fresh["api_key"].as_str().unwrap().to_string();
        assert_ne!(fresh_key, tenant.key, "{}", h.backend);
        h.get(&tenant.key, "/v1/jobs")
            .await
            .refused(401, "the old key after rotation");
        h.call("POST", "/v1/keys/rotate", Some(&tenant.key), None)
            .await
            .refused(401, "rotating with the old key");
        let balance = h.get(&fresh_key, "/v1/balance").await.expect(200, "the new key works");
        assert_eq!(balance["account_id"], tenant.id, "{}: same account", h.backend);
        let keys = h
            .get(&fresh_key, &format!("/v1/accounts/{}/keys", tenant.id))
            .await
            .expect(200, "keys");
        let states: Vec<(bool, bool)> = keys
            .as_array()
            .expect("keys")
            .iter()
            .map(|key| (key["key_id"] == tenant.key_id.as_str(), key["revoked_at_us"].is_i64()))
            .collect();
        assert_eq!(states.len(), 2, "{}: {keys}", h.backend);
        assert!(
            states.contains(&(true, true)),
            "{}: the old key is revoked: {keys}",
            h.backend
        );
        assert!(
            states.contains(&(false, false)),
            "{}: the new key is live: {keys}",
            h.backend
        );
    })
    .await;
}
