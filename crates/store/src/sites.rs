//! Sites: the coordinates an admin sets for a site once. A node that names the site and declares
//! no coordinates of its own takes them, at registration and whenever the site's change.

use sqlx::Row;

use crate::{Result, Store};

/// A site's coordinates, as an admin set them.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteRecord {
    pub name: String,
    pub latitude: f64,
    pub longitude: f64,
    pub updated_at: i64,
}

impl Store {
    /// Sets a site's coordinates and moves every node at the site that declared none to them
    /// (`location_source` "site"), in one transaction. Returns how many nodes moved.
    pub async fn set_site(&self, site: &SiteRecord) -> Result<u64> {
        let mut transaction = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO sites (name, latitude, longitude, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO UPDATE SET latitude = excluded.latitude, longitude = excluded.longitude, \
             updated_at = excluded.updated_at",
        )
        .bind(&site.name)
        .bind(site.latitude)
        .bind(site.longitude)
        .bind(site.updated_at)
        .execute(&mut *transaction)
        .await?;
        let moved = sqlx::query(
            "UPDATE nodes SET latitude = $1, longitude = $2, location_source = 'site', updated_at = $3 \
             WHERE site = $4 AND location_source <> 'flag'",
        )
        .bind(site.latitude)
        .bind(site.longitude)
        .bind(site.updated_at)
        .bind(&site.name)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(moved.rows_affected())
    }

    pub async fn site(&self, name: &str) -> Result<Option<SiteRecord>> {
        let row = sqlx::query("SELECT name, latitude, longitude, updated_at FROM sites WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(site_from).transpose()
    }

    /// Every site, by name.
    pub async fn sites(&self) -> Result<Vec<SiteRecord>> {
        let rows = sqlx::query("SELECT name, latitude, longitude, updated_at FROM sites ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(site_from).collect()
    }
}

fn site_from(row: &sqlx::any::AnyRow) -> Result<SiteRecord> {
    Ok(SiteRecord {
        name: row.try_get("name")?,
        latitude: row.try_get("latitude")?,
        longitude: row.try_get("longitude")?,
        updated_at: row.try_get("updated_at")?,
    })
}
