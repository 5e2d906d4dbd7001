//! The ledger's accounts, their stable text keys (the coordinator stores entries in SQL by key)
//! and the limit each one keeps.

use std::fmt;

use crate::LedgerError;

/// One account of the double-entry ledger. Ids are the coordinator database's integer ids.
///
/// The derived order (kind first, then id) is the order `Ledger::balances` lists accounts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Account {
    /// A tenant's spendable balance. Never below zero.
    TenantAvailable(i64),
    /// Money held for one running job (the id is the job's). Never below zero.
    Escrow(i64),
    /// Money held for one booking of capacity ahead (the id is the reservation's). Never below
    /// zero.
    ReservationEscrow(i64),
    /// What a provider has earned and not yet been paid out or posted as bond. Never below zero.
    ProviderEarnings(i64),
    /// A provider's bond, slashed on proven fraud. Never below zero.
    ProviderBond(i64),
    /// The platform's fee income. Never below zero.
    PlatformFees,
    /// The platform's pot that pays SLA credits. May go negative: the platform owes it.
    PlatformSla,
    /// The outside world (the stand-in for a payment provider). Goes negative as money comes in.
    External,
}

impl Account {
    /// The stable text form, e.g. `tenant:7:available`. [`Account::parse`] reads it back.
    pub fn key(&self) -> String {
        self.to_string()
    }

    /// Reads a key written by [`Account::key`]. Only the exact canonical form is accepted
    /// (no `+7`, no `007`), so one account never has two keys in the database.
    pub fn parse(text: &str) -> Result<Account, LedgerError> {
        let bad = || LedgerError::BadAccount(text.to_string());
        let parts: Vec<&str> = text.split(':').collect();
        let account = match parts.as_slice() {
            ["external"] => Account::External,
            ["platform", "fees"] => Account::PlatformFees,
            ["platform", "sla"] => Account::PlatformSla,
            ["tenant", id, "available"] => Account::TenantAvailable(id.parse().map_err(|_| bad())?),
            ["escrow", "job", id] => Account::Escrow(id.parse().map_err(|_| bad())?),
            ["escrow", "reservation", id] => Account::ReservationEscrow(id.parse().map_err(|_| bad())?),
            ["provider", id, "earnings"] => Account::ProviderEarnings(id.parse().map_err(|_| bad())?),
            ["provider", id, "bond"] => Account::ProviderBond(id.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        if account.key() != text {
            return Err(bad());
        }
        Ok(account)
    }

    /// Whether the rules let this account's balance fall below zero. Every other account's
    /// floor is zero: nobody spends, holds or is paid money that is not there.
    pub fn may_go_negative(&self) -> bool {
        matches!(self, Account::PlatformSla | Account::External)
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Account::TenantAvailable(id) => write!(f, "tenant:{id}:available"),
            Account::Escrow(job) => write!(f, "escrow:job:{job}"),
            Account::ReservationEscrow(reservation) => write!(f, "escrow:reservation:{reservation}"),
            Account::ProviderEarnings(id) => write!(f, "provider:{id}:earnings"),
            Account::ProviderBond(id) => write!(f, "provider:{id}:bond"),
            Account::PlatformFees => f.write_str("platform:fees"),
            Account::PlatformSla => f.write_str("platform:sla"),
            Account::External => f.write_str("external"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(account: Account, key: &str) {
        assert_eq!(account.key(), key);
        assert_eq!(Account::parse(key), Ok(account), "{key}");
    }

    #[test]
    fn every_kind_round_trips_through_its_key() {
        check(Account::TenantAvailable(7), "tenant:7:available");
        check(Account::Escrow(42), "escrow:job:42");
        check(Account::ReservationEscrow(5), "escrow:reservation:5");
        check(Account::ProviderEarnings(3), "provider:3:earnings");
        check(Account::ProviderBond(3), "provider:3:bond");
        check(Account::PlatformFees, "platform:fees");
        check(Account::PlatformSla, "platform:sla");
        check(Account::External, "external");
        check(
            Account::TenantAvailable(i64::MAX),
            "tenant:9223372036854775807:available",
        );
        check(Account::Escrow(i64::MIN), "escrow:job:-9223372036854775808");
    }

    #[test]
    fn non_canonical_and_unknown_keys_are_refused() {
        for text in [
            "",
            "tenant:7",
            "tenant::available",
            "tenant:+7:available",
            "tenant:07:available",
            "tenant:-0:available",
            "tenant:7:available:",
            "Tenant:7:available",
            "escrow:7",
            "provider:3:wallet",
            "platform",
            "platform:rent",
            "external:1",
            "tenant:99999999999999999999:available",
        ] {
            assert_eq!(
                Account::parse(text),
                Err(LedgerError::BadAccount(text.to_string())),
                "{text:?}"
            );
        }
    }

    #[test]
    fn only_the_sla_pot_and_the_outside_world_may_go_negative() {
        let negative: Vec<Account> = [
            Account::TenantAvailable(1),
            Account::Escrow(1),
            Account::ProviderEarnings(1),
            Account::ProviderBond(1),
            Account::PlatformFees,
            Account::PlatformSla,
            Account::External,
        ]
        .into_iter()
        .filter(Account::may_go_negative)
        .collect();
        assert_eq!(negative, [Account::PlatformSla, Account::External]);
    }
}
