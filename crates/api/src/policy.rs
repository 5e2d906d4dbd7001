//! A provider's policy on the wire: asks per tier in dollars, time-of-day price rules,
//! availability windows, allowed tiers and classes, thermal and power limits.

use model::{AvailabilityWindow, ClassSet, Micros, PriceRule, ProviderPolicy, Tier, TierSet, WorkloadClass};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::InputError;

pub const PRICE_RULES_MAX: usize = 64;
pub const WINDOWS_MAX: usize = 256;

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PolicyDoc {
    /// Ask per GPU-hour in dollars for each tier sold: keys gold, silver, bronze.
    pub asks: std::collections::BTreeMap<String, String>,
    /// Time-of-day scaling, first match wins (e.g. peak hours × 1.3).
    #[serde(default)]
    pub price_rules: Vec<PriceRuleDoc>,
    /// When the node sells; empty = always.
    #[serde(default)]
    pub windows: Vec<WindowDoc>,
    /// Tiers allowed; empty = those with an ask.
    #[serde(default)]
    pub allowed_tiers: Vec<String>,
    /// Workload classes allowed; empty = all.
    #[serde(default)]
    pub allowed_classes: Vec<String>,
    #[serde(default)]
    pub thermal_limit_c: Option<u16>,
    #[serde(default)]
    pub power_limit_w: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PriceRuleDoc {
    /// Days, 0 = Monday … 6 = Sunday; empty = every day.
    #[serde(default)]
    pub days: Vec<u8>,
    pub start_minute: u32,
    pub end_minute: u32,
    /// The ask in this slot is the base ask × this / 1000.
    pub multiplier_permille: u32,
}

/// A weekly window (days + minutes of the day, UTC) or a one-off interval (microseconds).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WindowDoc {
    #[serde(default)]
    pub days: Vec<u8>,
    #[serde(default)]
    pub start_minute: Option<u32>,
    #[serde(default)]
    pub end_minute: Option<u32>,
    #[serde(default)]
    pub start_us: Option<i64>,
    #[serde(default)]
    pub end_us: Option<i64>,
}

fn days_mask(days: &[u8], what: &str) -> Result<u8, InputError> {
    if days.is_empty() {
        return Ok(0x7f);
    }
    let mut mask = 0u8;
    for day in days {
        if *day > 6 {
            return Err(InputError(format!("{what}: day {day} is not 0 (Monday) … 6 (Sunday)")));
        }
        mask |= 1 << day;
    }
    Ok(mask)
}

fn minutes(start: u32, end: u32, what: &str) -> Result<(), InputError> {
    if start >= end || end > 1440 {
        return Err(InputError(format!(
            "{what}: minutes {start}..{end} must satisfy start < end ≤ 1440"
        )));
    }
    Ok(())
}

impl PolicyDoc {
    /// Checks the document and builds the model's policy.
    pub fn to_model(&self) -> Result<ProviderPolicy, InputError> {
        let mut asks = [None; 3];
        for (tier, ask) in &self.asks {
            let tier = Tier::parse(tier).ok_or_else(|| {
                InputError(format!(
                    "policy.asks: unknown tier {tier:?}; use gold, silver or bronze"
                ))
            })?;
            let micros = Micros::parse_dollars(ask)
                .filter(|micros| micros.0 > 0 && micros.0 <= crate::PRICE_MICROS_MAX)
                .ok_or_else(|| {
                    InputError(format!(
                        "policy.asks.{tier}: {ask:?} is not a price in dollars between 0.000001 and 1000"
                    ))
                })?;
            asks[tier as usize] = Some(micros);
        }
        if asks.iter().all(Option::is_none) {
            return Err(InputError("policy.asks: give an ask for at least one tier".to_string()));
        }
        if self.price_rules.len() > PRICE_RULES_MAX {
            return Err(InputError(format!("policy.price_rules: at most {PRICE_RULES_MAX}")));
        }
        if self.windows.len() > WINDOWS_MAX {
            return Err(InputError(format!("policy.windows: at most {WINDOWS_MAX}")));
        }
        let mut price_rules = Vec::with_capacity(self.price_rules.len());
        for rule in &self.price_rules {
            minutes(rule.start_minute, rule.end_minute, "policy.price_rules")?;
            if !(100..=10_000).contains(&rule.multiplier_permille) {
                return Err(InputError(format!(
                    "policy.price_rules: multiplier_permille {} must be 100–10000",
                    rule.multiplier_permille
                )));
            }
            price_rules.push(PriceRule {
                days: days_mask(&rule.days, "policy.price_rules")?,
                start_minute: rule.start_minute,
                end_minute: rule.end_minute,
                multiplier_permille: rule.multiplier_permille,
            });
        }
        let mut windows = Vec::with_capacity(self.windows.len());
        for window in &self.windows {
            windows.push(
                match (window.start_minute, window.end_minute, window.start_us, window.end_us) {
                    (Some(start), Some(end), None, None) => {
                        minutes(start, end, "policy.windows")?;
                        AvailabilityWindow::Weekly {
                            days: days_mask(&window.days, "policy.windows")?,
                            start_minute: start,
                            end_minute: end,
                        }
                    }
                    (None, None, Some(start), Some(end)) if start < end && window.days.is_empty() => {
                        AvailabilityWindow::Once {
                            start: start.div_euclid(1_000_000),
                            end: end.div_euclid(1_000_000),
                        }
                    }
                    _ => {
                        return Err(InputError(
                            "policy.windows: give either start_minute and end_minute (weekly, with days) or \
                         start_us < end_us (once)"
                                .to_string(),
                        ));
                    }
                },
            );
        }
        let allowed_tiers = if self.allowed_tiers.is_empty() {
            TierSet::of(
                &Tier::ALL
                    .into_iter()
                    .filter(|tier| asks[*tier as usize].is_some())
                    .collect::<Vec<_>>(),
            )
        } else {
            let tiers = self
                .allowed_tiers
                .iter()
                .map(|tier| {
                    Tier::parse(tier).ok_or_else(|| InputError(format!("policy.allowed_tiers: unknown tier {tier:?}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            TierSet::of(&tiers)
        };
        let allowed_classes = if self.allowed_classes.is_empty() {
            ClassSet::of(&WorkloadClass::ALL)
        } else {
            let classes = self
                .allowed_classes
                .iter()
                .map(|class| {
                    parse_class(class)
                        .ok_or_else(|| InputError(format!("policy.allowed_classes: unknown class {class:?}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            ClassSet::of(&classes)
        };
        Ok(ProviderPolicy {
            asks,
            price_rules,
            windows,
            allowed_tiers,
            allowed_classes,
            thermal_limit_c: self.thermal_limit_c,
            power_limit_w: self.power_limit_w,
        })
    }
}

pub fn parse_class(text: &str) -> Option<WorkloadClass> {
    WorkloadClass::ALL.into_iter().find(|class| class.name() == text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(json: &str) -> Result<ProviderPolicy, String> {
        let doc: PolicyDoc = serde_json::from_str(json).map_err(|error| error.to_string())?;
        doc.to_model().map_err(|error| error.0)
    }

    #[test]
    fn a_full_policy_converts() {
        let policy = doc(
            r#"{"asks": {"silver": "2.10", "bronze": "0.90"},
                "price_rules": [{"days": [0,1,2,3,4], "start_minute": 540, "end_minute": 1080, "multiplier_permille": 1300}],
                "windows": [{"days": [5, 6], "start_minute": 0, "end_minute": 1440}],
                "allowed_classes": ["training", "batch"], "thermal_limit_c": 83}"#,
        )
        .unwrap();
        assert_eq!(policy.asks[Tier::Silver as usize], Some(Micros(2_100_000)));
        assert_eq!(policy.asks[Tier::Gold as usize], None);
        assert!(!policy.allowed_tiers.contains(Tier::Gold));
        assert!(policy.allowed_tiers.contains(Tier::Bronze));
        assert!(!policy.allowed_classes.contains(WorkloadClass::Inference));
        assert_eq!(policy.price_rules[0].days, 0b1_1111);
        assert_eq!(policy.windows.len(), 1);
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        for (json, says) in [
            (r#"{"asks": {}}"#, "at least one tier"),
            (r#"{"asks": {"platinum": "1"}}"#, "unknown tier"),
            (r#"{"asks": {"gold": "-1"}}"#, "not a price"),
            (r#"{"asks": {"gold": "1e3"}}"#, "not a price"),
            (
                r#"{"asks": {"gold": "1"}, "windows": [{"start_minute": 10}]}"#,
                "either",
            ),
            (
                r#"{"asks": {"gold": "1"}, "windows": [{"days": [9], "start_minute": 0, "end_minute": 10}]}"#,
                "day 9",
            ),
            (
                r#"{"asks": {"gold": "1"}, "price_rules": [{"start_minute": 0, "end_minute": 10, "multiplier_permille": 5}]}"#,
                "100–10000",
            ),
            (r#"{"asks": {"gold": "1"}, "colour": "red"}"#, "unknown field"),
        ] {
            let error = doc(json).unwrap_err();
            assert!(error.contains(says), "{json}: {error}");
        }
    }
}
