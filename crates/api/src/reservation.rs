//! Booking capacity ahead: `POST /v1/reservations` and what it answers, and a provider's
//! calendar of the windows booked on a node.

use model::{Micros, Tier};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{InputError, JobRequest};

/// The most GPUs one booking holds.
pub const RESERVATION_GPUS_MAX: u32 = 4096;
/// The longest booking: four weeks.
pub const RESERVATION_HOURS_MAX: u32 = 28 * 24;
/// How far ahead a booking may start: a year.
pub const RESERVATION_AHEAD_MAX_US: i64 = 366 * 24 * 3600 * 1_000_000;

/// `POST /v1/reservations`: whole GPUs of one model from a start time for some hours, at most
/// a price per GPU-hour. The price is fixed at booking and the whole of it held then.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReservationRequest {
    /// Whole GPUs to book (1–4096).
    pub gpus: u32,
    /// The GPU model (a catalog name or alias, e.g. "H100").
    pub gpu_model: String,
    /// When the booking starts, µs since the Unix epoch (in the future, within a year).
    pub starts_at_us: i64,
    /// How long it lasts, in whole hours (1–672).
    pub hours: u32,
    /// The most paid per GPU-hour, in dollars ("3").
    pub max_price_per_gpu_hour: String,
    /// Regions allowed; empty = any.
    #[serde(default)]
    pub regions: Vec<String>,
    /// Where all the booked GPUs must be: node, nvlink, fabric, site, region or any (default).
    #[serde(default = "any")]
    pub topology: String,
}

fn any() -> String {
    "any".into()
}

impl ReservationRequest {
    /// The booking's shape as a job the matcher books: one-GPU gold replicas, one per GPU, for
    /// the booking's hours.
    pub fn as_job(&self) -> JobRequest {
        JobRequest {
            name: format!("reservation of {} {}", self.gpus, self.gpu_model),
            image: "reservation".into(),
            gpus: Some(1),
            gpu_models: vec![self.gpu_model.clone()],
            replicas: self.gpus,
            topology: self.topology.clone(),
            tier: Tier::Gold.name().into(),
            class: "batch".into(),
            network: "none".into(),
            max_price_per_gpu_hour: self.max_price_per_gpu_hour.clone(),
            regions: self.regions.clone(),
            max_runtime_s: self.hours.saturating_mul(3600),
            ..JobRequest::default()
        }
    }

    /// Checks what `as_job` does not: the counts and the start, against `now_us`.
    pub fn check(&self, now_us: i64) -> Result<Micros, InputError> {
        if !(1..=RESERVATION_GPUS_MAX).contains(&self.gpus) {
            return Err(InputError(format!(
                "gpus: {} is not 1–{RESERVATION_GPUS_MAX}",
                self.gpus
            )));
        }
        if !(1..=RESERVATION_HOURS_MAX).contains(&self.hours) {
            return Err(InputError(format!(
                "hours: {} is not 1–{RESERVATION_HOURS_MAX}",
                self.hours
            )));
        }
        if self.starts_at_us <= now_us {
            return Err(InputError(format!(
                "starts_at_us: {} is not in the future (now is {now_us}); a booking starts ahead",
                self.starts_at_us
            )));
        }
        if self.starts_at_us - now_us > RESERVATION_AHEAD_MAX_US {
            return Err(InputError("starts_at_us: a booking starts within a year".into()));
        }
        Micros::parse_dollars(&self.max_price_per_gpu_hour)
            .filter(|price| price.0 > 0 && price.0 <= 1_000_000_000)
            .ok_or_else(|| {
                InputError(format!(
                    "max_price_per_gpu_hour: {:?} is not a price in dollars between 0.000001 and 1000 (e.g. \"3\")",
                    self.max_price_per_gpu_hour
                ))
            })
    }
}

/// One node's part of a reservation.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReservationNodeView {
    pub node_id: i64,
    pub gpus: i64,
    /// Per GPU-hour, fixed at booking.
    pub price_micros_per_gpu_hour: i64,
    pub held_from_us: i64,
    pub held_until_us: i64,
    /// When the node was lost to the booking (replaced, or refunded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_at_us: Option<i64>,
}

/// A reservation as its tenant sees it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReservationView {
    pub id: i64,
    /// booked (before its start), active, ended or cancelled.
    pub state: String,
    pub state_reason: String,
    pub gpus: i64,
    pub gpu_model: String,
    pub regions: Vec<String>,
    pub topology: String,
    pub starts_at_us: i64,
    pub ends_at_us: i64,
    /// What the booking costs: its GPU-hours at their prices.
    pub cost_micros: i64,
    /// Held at booking.
    pub hold_micros: i64,
    /// What is held for it now (the hold less what was paid out or refunded).
    pub escrow_micros: i64,
    /// What a cancellation now gives back (docs/reservations.md, "Cancelling").
    pub refund_if_cancelled_micros: i64,
    pub nodes: Vec<ReservationNodeView>,
    pub created_at_us: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReservationList {
    pub reservations: Vec<ReservationView>,
}

/// A window booked on a node.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct CalendarEntry {
    pub reservation_id: i64,
    /// The reservation's state.
    pub state: String,
    pub gpus: i64,
    pub price_micros_per_gpu_hour: i64,
    pub from_us: i64,
    pub until_us: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_at_us: Option<i64>,
}

/// `GET /v1/nodes/{id}/calendar`: the windows booked on a node that have not ended.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct CalendarView {
    pub node_id: i64,
    pub entries: Vec<CalendarEntry>,
}

/// `POST /v1/own-providers`: link a provider account of the tenant's own organisation, proven
/// by its API key. The tenant's jobs then go to that account's nodes first, at no market price.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OwnProviderRequest {
    /// An API key of the provider account (checked, never stored here).
    pub provider_key: String,
}

/// A provider account a tenant linked as its own.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct OwnProviderView {
    pub provider_id: i64,
    pub name: String,
    pub linked_at_us: i64,
    /// Its nodes now.
    pub nodes: i64,
    /// Their GPUs now.
    pub gpus: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct OwnProviderList {
    pub providers: Vec<OwnProviderView>,
}
