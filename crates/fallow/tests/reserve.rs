//! Capacity set aside, from the command line, against a real `fallow dev`. Booking ahead:
//! `reserve create` books the dev node's two H100s a day ahead with the whole price held; a
//! booking the fleet cannot meet fails with the reason; the provider sees the window in `node
//! calendar list`; a job submitted with `--reservation` waits for the start; `reserve cancel`
//! gives the hold back and ends it. Hybrid: a tenant's own provider account's node runs its job
//! at no market price.

mod common;

use common::dev::{fallow, json};
use common::{failed_saying, succeeded};

#[test]
fn a_tenant_books_ahead_and_the_provider_sees_the_booked_window() {
    let started = common::dev::start_ready("fallow-reserve");
    let (mut dev, url, key) = (started.dev, started.url, started.tenant_key.as_str());
    let provider_key =
        std::fs::read_to_string(started.scratch.path.join("data").join("provider.key")).expect("provider.key");
    let provider_key = provider_key.trim();
    let from = now_rfc3339(86_400 + 600);
    // The market sees the dev node once the coordinator's view has it: a quote says when.
    let start = std::time::Instant::now();
    loop {
        let quote = json(
            fallow(
                &url,
                key,
                &[
                    "job",
                    "quote",
                    "--gpus",
                    "2",
                    "--tier",
                    "gold",
                    "--max-price",
                    "5",
                    "--json",
                ],
            ),
            "job quote",
        );
        if quote["nodes_feasible"].as_i64().unwrap_or(0) >= 1 {
            break;
        }
        assert!(
            start.elapsed() < common::dev::WITHIN,
            "the dev node never fits: {quote}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let before = json(fallow(&url, key, &["tenant", "balance", "--json"]), "balance");

    let booked = json(
        fallow(
            &url,
            key,
            &[
                "reserve",
                "create",
                "--gpus",
                "2",
                "--gpu-model",
                "H100",
                "--from",
                &from,
                "--hours",
                "2",
                "--max-price",
                "5",
                "--json",
            ],
        ),
        "reserve create",
    );
    assert_eq!(booked["state"], "booked", "{booked}");
    let id = booked["id"].as_i64().expect("id");
    let hold = booked["hold_micros"].as_i64().expect("hold");
    assert!(hold > 0, "{booked}");
    let after = json(fallow(&url, key, &["tenant", "balance", "--json"]), "balance");
    assert_eq!(
        before["available_micros"].as_i64().unwrap_or(0) - after["available_micros"].as_i64().unwrap_or(0),
        hold,
        "the whole price held at booking: {after}"
    );

    // Sixty-four cannot be met on a two-GPU fleet: refused, saying why, and nothing held.
    failed_saying(
        &fallow(
            &url,
            key,
            &[
                "reserve",
                "create",
                "--gpus",
                "64",
                "--gpu-model",
                "H100",
                "--from",
                &from,
                "--hours",
                "8",
                "--max-price",
                "3",
            ],
        ),
        "reserve create of 64",
        &["cannot be met", "only 0 of the 64 GPUs"],
    );

    let listed = succeeded(&fallow(&url, key, &["reserve", "list"]), "reserve list");
    assert!(
        listed.contains("booked") && listed.contains(&id.to_string()),
        "{listed}"
    );
    let shown = succeeded(
        &fallow(&url, key, &["reserve", "show", &id.to_string()]),
        "reserve show",
    );
    assert!(shown.contains("back if cancelled now"), "{shown}");

    let node = booked["nodes"][0]["node_id"].as_i64().expect("node");
    let calendar = succeeded(
        &fallow(&url, provider_key, &["node", "calendar", "list", &node.to_string()]),
        "node calendar list",
    );
    assert!(calendar.contains("booked ahead"), "{calendar}");
    let calendar = json(
        fallow(
            &url,
            provider_key,
            &["node", "calendar", "list", &node.to_string(), "--json"],
        ),
        "node calendar list --json",
    );
    assert_eq!(calendar["booked"][0]["reservation_id"], id, "{calendar}");

    // A job inside the booking waits for its start.
    let job = json(
        fallow(
            &url,
            key,
            &[
                "job",
                "submit",
                "--gpus",
                "2",
                "--tier",
                "gold",
                "--max-price",
                "5",
                "--reservation",
                &id.to_string(),
                "--json",
                "--process",
                "--",
                "true",
            ],
        ),
        "job submit --reservation",
    );
    let job_id = job["id"].as_i64().expect("job id").to_string();
    let start = std::time::Instant::now();
    loop {
        let view = json(fallow(&url, key, &["job", "show", &job_id, "--json"]), "job show");
        if view["state_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("starts at"))
        {
            assert_eq!(view["state"], "queued", "{view}");
            break;
        }
        assert!(
            start.elapsed() < common::dev::WITHIN,
            "never waited for the start: {view}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    let cancelled = json(
        fallow(&url, key, &["reserve", "cancel", &id.to_string(), "--json"]),
        "reserve cancel",
    );
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    let back = json(fallow(&url, key, &["tenant", "balance", "--json"]), "balance");
    assert_eq!(
        back["available_micros"], before["available_micros"],
        "all back a day ahead: {back}"
    );
    let ended = json(fallow(&url, key, &["job", "show", &job_id, "--json"]), "job show");
    assert_eq!(ended["state"], "cancelled", "{ended}");

    let status = dev.stop_with("-TERM");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
}

/// Now plus `seconds`, as RFC 3339 in UTC, to the minute.
fn now_rfc3339(seconds: i64) -> String {
    let at = common::now_ms() / 1000 + seconds;
    let (year, month, day) = model::time::civil_from_days(at.div_euclid(86_400));
    let of_day = at.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60
    )
}

/// Hybrid from the command line: the dev tenant links the dev provider account (its key file
/// proves it); a job then runs on that provider's node at no market price, `job show` says so,
/// and nothing is charged.
#[test]
fn a_tenant_links_its_own_provider_and_its_job_runs_there_unpriced() {
    let started = common::dev::start_ready("fallow-hybrid");
    let (mut dev, url, key) = (started.dev, started.url, started.tenant_key.as_str());
    let key_file = started.scratch.path.join("data").join("provider.key");
    let key_file = key_file.to_str().expect("a UTF-8 path");
    let linked = succeeded(
        &fallow(&url, key, &["tenant", "link", "--provider-key-file", key_file]),
        "tenant link",
    );
    assert!(linked.contains("your jobs go to these nodes first"), "{linked}");
    let listed = json(fallow(&url, key, &["tenant", "links", "--json"]), "tenant links");
    assert_eq!(listed["providers"][0]["gpus"], 2, "{listed}");

    let before = json(fallow(&url, key, &["tenant", "balance", "--json"]), "balance");
    let ran = succeeded(
        &fallow(
            &url,
            key,
            &[
                "job",
                "submit",
                "--wait",
                "--gpus",
                "1",
                "--tier",
                "silver",
                "--max-price",
                "5",
                "--process",
                "--",
                "echo",
                "done",
            ],
        ),
        "job submit --wait",
    );
    assert!(ran.contains("done"), "{ran}");
    let jobs = json(fallow(&url, key, &["job", "list", "--json"]), "job list");
    let id = jobs["jobs"][0]["id"].as_i64().expect("a job").to_string();
    let shown = succeeded(&fallow(&url, key, &["job", "show", &id]), "job show");
    assert!(shown.contains("your own nodes (no market price)"), "{shown}");
    let after = json(fallow(&url, key, &["tenant", "balance", "--json"]), "balance");
    assert_eq!(
        after["available_micros"], before["available_micros"],
        "nothing charged: {after}"
    );

    let unlinked = succeeded(
        &fallow(
            &url,
            key,
            &["tenant", "unlink", &listed["providers"][0]["provider_id"].to_string()],
        ),
        "tenant unlink",
    );
    assert!(unlinked.contains("no provider accounts linked"), "{unlinked}");
    let status = dev.stop_with("-TERM");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
}
