//! What the store's test files share: a fresh database per backend, and running a test on each.
//! Every test runs on SQLite (a real file) and on PostgreSQL (a real server, from
//! `FALLOW_TEST_POSTGRES_URL`). Without that variable the PostgreSQL leg is skipped with a loud
//! message, unless `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use store::Store;

static NEXT: AtomicU64 = AtomicU64::new(0);

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .subsec_nanos()
    )
}

/// A fresh, empty database per backend: a new SQLite file, and a new PostgreSQL database.
pub async fn backends() -> Vec<(&'static str, Store)> {
    let path = std::env::temp_dir().join(format!("{}.db", unique("fallow_store")));
    let sqlite = Store::open(&format!("sqlite://{}", path.display()))
        .await
        .expect("SQLite store opens");
    let mut out = vec![("sqlite", sqlite)];
    match std::env::var("FALLOW_TEST_POSTGRES_URL") {
        Ok(url) => {
            let name = unique("fallow_t");
            // The base database only hosts CREATE DATABASE: no migrations are applied to it.
            sqlx::any::install_default_drivers();
            let mut admin = <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
                .await
                .expect("PostgreSQL at FALLOW_TEST_POSTGRES_URL answers");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut admin)
                .await
                .expect("create a test database");
            let _ = sqlx::Connection::close(admin).await;
            let (base, _) = url.rsplit_once('/').expect("URL names a database");
            let store = Store::open(&format!("{base}/{name}"))
                .await
                .expect("test database opens");
            out.push(("postgres", store));
        }
        Err(_) if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("FALLOW_TEST_POSTGRES_URL is not set but FALLOW_CI_REQUIRE_SERVICES=1: the PostgreSQL leg must run")
        }
        Err(_) => eprintln!("SKIPPED: PostgreSQL leg (set FALLOW_TEST_POSTGRES_URL to run it)"),
    }
    out
}

pub async fn on_every_backend<F, Fut>(test: F)
where
    F: Fn(&'static str, Store) -> Fut,
    Fut: Future<Output = ()>,
{
    for (name, store) in backends().await {
        test(name, store.clone()).await;
        store.close().await;
    }
}
