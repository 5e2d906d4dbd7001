//! The offer search language, in the spirit of `vastai search offers`: a query such as
//! `gpu_model=H100 reliability>0.95 region in [eu-west,eu-north] price<2.5` parsed into an
//! [`OfferFilter`] that says which [`OfferView`]s it admits.
//!
//! Grammar (every clause must hold; the empty query admits every offer):
//!
//! ```text
//! query    = clause*                          whitespace between clauses and around tokens
//! clause   = field operator value
//!          | field ("in" | "notin") "[" value ("," value)* "]"
//! operator = "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
//! value    = word | '"' (any character; \" and \\ escape) '"'
//! word     = (ASCII letter | digit | "-" | "_" | ".")+
//! ```
//!
//! A value is read as the field needs it: a decimal number (`2.5`, `-1`, `.5`), `true`/`false`, a
//! tier (`gold`, `silver`, `bronze`) or a name. Field names, `in`/`notin`, booleans and tiers are
//! case-insensitive; names compare case-insensitively.
//!
//! Fields and what they read from the offer:
//! - `gpu_model`, `region`, `site`: names (`=` `!=` `in` `notin`). `gpu_model` also matches by
//!   prefix up to a `-` or `_`: `gpu_model=H100` admits `H100-SXM5` and `H100-PCIe`, and
//!   `gpu_model=A100-SXM4` admits `A100-SXM4-80GB`, but `gpu_model=H20` does not admit `H200-SXM`
//!   nor `L4` admit `L40` (different GPUs whose names share leading characters).
//! - `gpu_count`, `gpus_free`, `gpu_memory_mib`, `gpu_memory_gb` (mib / 1024), `compute_units`,
//!   `reliability` (0–1), `node_id`, `provider_id`, `price`: numbers (every operator).
//! - `price`: dollars per GPU-hour, the lowest of the offer's asks in the tiers the query admits
//!   (`tier=gold` admits gold alone, `tier in [gold, silver]` those two, no tier clause every
//!   tier). An offer with no ask in those tiers has no price, and no `price` clause holds for it,
//!   `!=` and `notin` included: an offer that cannot be bought is not "cheaper than" anything.
//! - `online`, `simulated`: `true`/`false` (`=` `!=`).
//! - `tier`: the offer sells that tier (`=` `in`). At most one `tier=` per query; [`OfferFilter::tier`]
//!   returns it so the server shows and sorts by that tier's price.
//!
//! Numbers compare as `f64`: this is a filter, not money arithmetic, and `micros / 1e6` is the
//! correctly rounded dollar figure, so `price=3.10` holds for exactly 3_100_000 micros.

use model::Tier;

use crate::{InputError, OfferView};

/// The longest query accepted, in bytes.
pub const FILTER_BYTES_MAX: usize = 2048;
/// Clauses in one query.
pub const FILTER_CLAUSES_MAX: usize = 32;
/// Values in one `in [...]` or `notin [...]` list.
pub const FILTER_LIST_ITEMS_MAX: usize = 64;

/// A parsed offer query: the offers it admits are those every clause holds for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OfferFilter {
    clauses: Vec<Clause>,
    /// Each clause as the query wrote it, for saying which one excluded an offer.
    sources: Vec<String>,
    /// The tier named with `tier=`, if any.
    tier: Option<Tier>,
    /// The tiers whose asks `price` reads: the intersection of the tier clauses; None = every tier
    /// the offer sells, including any this build does not know.
    price_tiers: Option<Vec<Tier>>,
}

impl OfferFilter {
    /// Parses a query; the error says what is wrong and at which column (counted in characters
    /// from 1).
    pub fn parse(query: &str) -> Result<OfferFilter, InputError> {
        if query.len() > FILTER_BYTES_MAX {
            return bad(format!(
                "filter: longer than {FILTER_BYTES_MAX} bytes ({} given)",
                query.len()
            ));
        }
        let mut tokens = Tokens {
            tokens: tokenize(query)?.into_iter(),
            end_column: query.chars().count() + 1,
        };
        let mut filter = OfferFilter::default();
        let mut tier_column = None;
        let mut starts = Vec::new();
        while let Some(first) = tokens.next() {
            if filter.clauses.len() == FILTER_CLAUSES_MAX {
                return bad(format!(
                    "filter: more than {FILTER_CLAUSES_MAX} clauses (the next starts at column {})",
                    first.column
                ));
            }
            let column = first.column;
            starts.push(column);
            let (clause, names_tier) = parse_clause(first, &mut tokens)?;
            if let Clause::Tier { tiers } = &clause {
                if names_tier {
                    if let Some(earlier) = tier_column {
                        // Two `tier=` would leave `tier()` and `price` ambiguous; a query that
                        // wants either of two tiers says `tier in [...]`.
                        return bad(format!(
                            "filter: tier= given twice, at columns {earlier} and {column}; use tier in [...] for several"
                        ));
                    }
                    tier_column = Some(column);
                    filter.tier = tiers.first().copied();
                }
                let admitted = filter.price_tiers.get_or_insert_with(|| Tier::ALL.to_vec());
                admitted.retain(|tier| tiers.contains(tier));
            }
            filter.clauses.push(clause);
        }
        let chars: Vec<char> = query.chars().collect();
        filter.sources = starts
            .iter()
            .enumerate()
            .map(|(index, start)| {
                let end = starts.get(index + 1).map_or(chars.len(), |next| next - 1);
                chars[start - 1..end].iter().collect::<String>().trim().to_string()
            })
            .collect();
        Ok(filter)
    }

    /// The first clause the offer fails, as the query wrote it (None when it matches).
    pub fn excluded_by(&self, offer: &OfferView) -> Option<&str> {
        self.clauses
            .iter()
            .zip(&self.sources)
            .find(|(clause, _)| !self.holds(clause, offer))
            .map(|(_, source)| source.as_str())
    }

    /// Whether the offer satisfies every clause.
    pub fn matches(&self, offer: &OfferView) -> bool {
        self.clauses.iter().all(|clause| self.holds(clause, offer))
    }

    /// The tier the query names with `tier=…`, if any (the server uses it to pick which price to
    /// show and sort by).
    pub fn tier(&self) -> Option<&str> {
        self.tier.map(Tier::name)
    }

    fn holds(&self, clause: &Clause, offer: &OfferView) -> bool {
        match clause {
            Clause::Name { field, negated, names } => {
                let found = names.iter().any(|name| match field {
                    Field::GpuModel => gpu_model_matches(&offer.gpu_model, name),
                    Field::Site => offer.site.eq_ignore_ascii_case(name),
                    _ => offer.region.eq_ignore_ascii_case(name),
                });
                found != *negated
            }
            Clause::Number { field, test } => match self.number(*field, offer) {
                Some(value) => test.holds(value),
                None => false,
            },
            Clause::Flag { field, value } => {
                let actual = if *field == Field::Online {
                    offer.online
                } else {
                    offer.simulated
                };
                actual == *value
            }
            Clause::Tier { tiers } => tiers
                .iter()
                .any(|tier| offer.price_micros_per_gpu_hour.contains_key(tier.name())),
        }
    }

    fn number(&self, field: Field, offer: &OfferView) -> Option<f64> {
        Some(match field {
            Field::GpuCount => f64::from(offer.gpu_count),
            Field::GpusFree => f64::from(offer.gpus_free),
            Field::GpuMemoryMib => f64::from(offer.gpu_memory_mib),
            Field::GpuMemoryGb => f64::from(offer.gpu_memory_mib) / 1024.0,
            Field::ComputeUnits => offer.compute_units,
            Field::Reliability => offer.reliability,
            // Ids stay exact up to 2^53, far beyond any row count.
            Field::NodeId => offer.node_id as f64,
            Field::ProviderId => offer.provider_id as f64,
            Field::Price => {
                // The minimum is taken in integer micros, so ties and order are exact.
                let micros = offer
                    .price_micros_per_gpu_hour
                    .iter()
                    .filter(|(tier, _)| {
                        self.price_tiers
                            .as_ref()
                            .is_none_or(|admitted| admitted.iter().any(|admit| admit.name() == tier.as_str()))
                    })
                    .map(|(_, micros)| *micros)
                    .min()?;
                micros as f64 / 1e6
            }
            Field::GpuModel | Field::Region | Field::Site | Field::Online | Field::Simulated | Field::Tier => {
                return None;
            }
        })
    }
}

/// `value` names `model` whole, or its leading part up to a `-` or `_`, ignoring case. The
/// boundary keeps `H20` from admitting `H200-SXM` and `L4` from admitting `L40`.
fn gpu_model_matches(model: &str, value: &str) -> bool {
    let (model, value) = (model.as_bytes(), value.as_bytes());
    if model.len() < value.len() || !model[..value.len()].eq_ignore_ascii_case(value) {
        return false;
    }
    // Comparing bytes is safe for non-ASCII text: equal prefixes end on the same boundary.
    match model.get(value.len()) {
        None => true,
        Some(next) => !value.is_empty() && matches!(next, b'-' | b'_'),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Clause {
    /// `gpu_model`, `region`, `site`: any of the names holds (none, when negated).
    Name {
        field: Field,
        negated: bool,
        names: Vec<String>,
    },
    Number {
        field: Field,
        test: NumberTest,
    },
    /// `online`, `simulated`; `!=` is folded into the value.
    Flag {
        field: Field,
        value: bool,
    },
    /// The offer sells one of these tiers.
    Tier {
        tiers: Vec<Tier>,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum NumberTest {
    Less(f64),
    LessOrEqual(f64),
    Greater(f64),
    GreaterOrEqual(f64),
    /// `=` and `in` (and, negated, `!=` and `notin`).
    OneOf {
        negated: bool,
        values: Vec<f64>,
    },
}

impl NumberTest {
    fn holds(&self, value: f64) -> bool {
        match self {
            NumberTest::Less(limit) => value < *limit,
            NumberTest::LessOrEqual(limit) => value <= *limit,
            NumberTest::Greater(limit) => value > *limit,
            NumberTest::GreaterOrEqual(limit) => value >= *limit,
            NumberTest::OneOf { negated, values } => values.contains(&value) != *negated,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    GpuModel,
    GpusFree,
    GpuCount,
    GpuMemoryGb,
    GpuMemoryMib,
    ComputeUnits,
    Price,
    Tier,
    Reliability,
    Region,
    Site,
    Online,
    Simulated,
    NodeId,
    ProviderId,
}

/// In the order the "known fields" hint lists them: the most used first.
const FIELDS: [(&str, Field); 15] = [
    ("gpu_model", Field::GpuModel),
    ("gpus_free", Field::GpusFree),
    ("gpu_count", Field::GpuCount),
    ("gpu_memory_gb", Field::GpuMemoryGb),
    ("gpu_memory_mib", Field::GpuMemoryMib),
    ("compute_units", Field::ComputeUnits),
    ("price", Field::Price),
    ("tier", Field::Tier),
    ("reliability", Field::Reliability),
    ("region", Field::Region),
    ("site", Field::Site),
    ("online", Field::Online),
    ("simulated", Field::Simulated),
    ("node_id", Field::NodeId),
    ("provider_id", Field::ProviderId),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Name,
    Number,
    Flag,
    Tier,
}

impl Field {
    fn find(name: &str) -> Option<Field> {
        FIELDS
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(_, field)| *field)
    }

    fn name(self) -> &'static str {
        FIELDS
            .iter()
            .find(|(_, field)| *field == self)
            .map(|(name, _)| *name)
            .expect("FIELDS lists every Field")
    }

    fn kind(self) -> Kind {
        match self {
            Field::GpuModel | Field::Region | Field::Site => Kind::Name,
            Field::Online | Field::Simulated => Kind::Flag,
            Field::Tier => Kind::Tier,
            Field::GpusFree
            | Field::GpuCount
            | Field::GpuMemoryGb
            | Field::GpuMemoryMib
            | Field::ComputeUnits
            | Field::Price
            | Field::Reliability
            | Field::NodeId
            | Field::ProviderId => Kind::Number,
        }
    }
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Name => "a name",
            Kind::Number => "a number",
            Kind::Flag => "true or false",
            Kind::Tier => "a tier",
        }
    }

    fn operators(self) -> &'static [Operator] {
        use Operator::*;
        match self {
            Kind::Name => &[Equal, NotEqual, In, NotIn],
            Kind::Number => &[Equal, NotEqual, Less, LessOrEqual, Greater, GreaterOrEqual, In, NotIn],
            Kind::Flag => &[Equal, NotEqual],
            // A query names the tiers it would buy; `in` covers several, so no negative form is needed.
            Kind::Tier => &[Equal, In],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    In,
    NotIn,
}

impl Operator {
    fn symbol(self) -> &'static str {
        match self {
            Operator::Equal => "=",
            Operator::NotEqual => "!=",
            Operator::Less => "<",
            Operator::LessOrEqual => "<=",
            Operator::Greater => ">",
            Operator::GreaterOrEqual => ">=",
            Operator::In => "in",
            Operator::NotIn => "notin",
        }
    }

    fn takes_list(self) -> bool {
        matches!(self, Operator::In | Operator::NotIn)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum TokenKind {
    Word(String),
    Quoted(String),
    Operator(Operator),
    OpenBracket,
    CloseBracket,
    Comma,
}

#[derive(Clone, Debug, PartialEq)]
struct Token {
    kind: TokenKind,
    /// Where the token starts, in characters from 1.
    column: usize,
}

impl Token {
    fn describe(&self) -> String {
        match &self.kind {
            TokenKind::Word(word) => format!("{word:?}"),
            TokenKind::Quoted(text) => format!("the string {text:?}"),
            TokenKind::Operator(operator) => format!("{:?}", operator.symbol()),
            TokenKind::OpenBracket => "\"[\"".to_string(),
            TokenKind::CloseBracket => "\"]\"".to_string(),
            TokenKind::Comma => "\",\"".to_string(),
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

fn tokenize(query: &str) -> Result<Vec<Token>, InputError> {
    // Indexing chars makes the column of a token its index + 1; the query is at most
    // FILTER_BYTES_MAX bytes, so the copy is small.
    let chars: Vec<char> = query.chars().collect();
    let mut tokens = Vec::new();
    let mut at = 0;
    while let Some(&c) = chars.get(at) {
        let column = at + 1;
        let next = chars.get(at + 1).copied();
        let (kind, length) = match c {
            c if c.is_whitespace() => {
                at += 1;
                continue;
            }
            '[' => (TokenKind::OpenBracket, 1),
            ']' => (TokenKind::CloseBracket, 1),
            ',' => (TokenKind::Comma, 1),
            '=' if next == Some('=') => (TokenKind::Operator(Operator::Equal), 2),
            '=' => (TokenKind::Operator(Operator::Equal), 1),
            '!' if next == Some('=') => (TokenKind::Operator(Operator::NotEqual), 2),
            '!' => {
                return bad(format!(
                    "filter: \"!\" at column {column} must be followed by \"=\" (!=)"
                ));
            }
            '<' if next == Some('=') => (TokenKind::Operator(Operator::LessOrEqual), 2),
            '<' => (TokenKind::Operator(Operator::Less), 1),
            '>' if next == Some('=') => (TokenKind::Operator(Operator::GreaterOrEqual), 2),
            '>' => (TokenKind::Operator(Operator::Greater), 1),
            '"' => {
                let mut text = String::new();
                let mut end = at + 1;
                loop {
                    match chars.get(end) {
                        None => return bad(format!("filter: unclosed '\"' at column {column}")),
                        Some('"') => break,
                        Some('\\') => match chars.get(end + 1) {
                            None => return bad(format!("filter: unclosed '\"' at column {column}")),
                            Some(escaped) => {
                                text.push(*escaped);
                                end += 2;
                            }
                        },
                        Some(other) => {
                            text.push(*other);
                            end += 1;
                        }
                    }
                }
                (TokenKind::Quoted(text), end + 1 - at)
            }
            c if is_word_char(c) => {
                let word: String = chars[at..].iter().take_while(|c| is_word_char(**c)).collect();
                let length = word.len();
                (TokenKind::Word(word), length)
            }
            other => {
                return bad(format!(
                    "filter: unexpected character {other:?} at column {column}; put values that contain it in double quotes"
                ));
            }
        };
        tokens.push(Token { kind, column });
        at += length;
    }
    Ok(tokens)
}

struct Tokens {
    tokens: std::vec::IntoIter<Token>,
    /// The column just past the query, where "needs more" errors point.
    end_column: usize,
}

impl Tokens {
    fn next(&mut self) -> Option<Token> {
        self.tokens.next()
    }
}

/// One value as written, with where it was written.
struct Written {
    text: String,
    column: usize,
}

/// Parses one clause starting at `first`; also says whether it was a `tier=` (rather than
/// `tier in`).
fn parse_clause(first: Token, tokens: &mut Tokens) -> Result<(Clause, bool), InputError> {
    let TokenKind::Word(name) = &first.kind else {
        return bad(format!(
            "filter: expected a field name at column {}, found {}",
            first.column,
            first.describe()
        ));
    };
    let Some(field) = Field::find(name) else {
        let known: Vec<&str> = FIELDS.iter().map(|(known, _)| *known).collect();
        return bad(format!(
            "filter: unknown field {name:?} at column {}; known fields: {}",
            first.column,
            known.join(", ")
        ));
    };
    let operator_token = tokens.next();
    let operator = match operator_token.as_ref().map(|token| &token.kind) {
        Some(TokenKind::Operator(operator)) => *operator,
        Some(TokenKind::Word(word)) if word.eq_ignore_ascii_case("in") => Operator::In,
        Some(TokenKind::Word(word)) if word.eq_ignore_ascii_case("notin") => Operator::NotIn,
        _ => {
            let (column, found) = match &operator_token {
                Some(token) => (token.column, format!(", found {}", token.describe())),
                None => (tokens.end_column, String::new()),
            };
            return bad(format!(
                "filter: expected an operator after {} at column {column}{found}; use = == != < <= > >= in notin",
                field.name()
            ));
        }
    };
    let operator_column = operator_token.map_or(tokens.end_column, |token| token.column);
    let kind = field.kind();
    if !kind.operators().contains(&operator) {
        let allowed: Vec<&str> = kind.operators().iter().map(|operator| operator.symbol()).collect();
        return bad(format!(
            "filter: operator {} does not apply to {} ({}) at column {operator_column}; use {}",
            operator.symbol(),
            field.name(),
            kind.describe(),
            allowed.join(" ")
        ));
    }
    let written = if operator.takes_list() {
        parse_list(field, operator, tokens)?
    } else {
        vec![parse_single(field, operator, tokens)?]
    };
    let negated = matches!(operator, Operator::NotEqual | Operator::NotIn);
    let clause = match kind {
        Kind::Name => Clause::Name {
            field,
            negated,
            names: written.into_iter().map(|value| value.text).collect(),
        },
        Kind::Number => {
            let mut values = Vec::with_capacity(written.len());
            for value in &written {
                values.push(parse_number(&value.text).ok_or_else(|| {
                    InputError(format!(
                        "filter: {:?} is not a number for {} at column {}",
                        value.text,
                        field.name(),
                        value.column
                    ))
                })?);
            }
            let test = match (operator, values.first()) {
                (Operator::Less, Some(limit)) => NumberTest::Less(*limit),
                (Operator::LessOrEqual, Some(limit)) => NumberTest::LessOrEqual(*limit),
                (Operator::Greater, Some(limit)) => NumberTest::Greater(*limit),
                (Operator::GreaterOrEqual, Some(limit)) => NumberTest::GreaterOrEqual(*limit),
                _ => NumberTest::OneOf { negated, values },
            };
            Clause::Number { field, test }
        }
        Kind::Flag => {
            let value = written.first().expect("= and != take exactly one value");
            let truth = match value.text.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return bad(format!(
                        "filter: {:?} is not true or false for {} at column {}",
                        value.text,
                        field.name(),
                        value.column
                    ));
                }
            };
            Clause::Flag {
                field,
                value: truth != negated,
            }
        }
        Kind::Tier => {
            let mut tiers = Vec::with_capacity(written.len());
            for value in &written {
                tiers.push(Tier::parse(&value.text.to_ascii_lowercase()).ok_or_else(|| {
                    InputError(format!(
                        "filter: {:?} is not a tier (gold, silver or bronze) at column {}",
                        value.text, value.column
                    ))
                })?);
            }
            Clause::Tier { tiers }
        }
    };
    Ok((clause, operator == Operator::Equal && kind == Kind::Tier))
}

fn parse_single(field: Field, operator: Operator, tokens: &mut Tokens) -> Result<Written, InputError> {
    let what = format!("{} {}", field.name(), operator.symbol());
    match tokens.next() {
        Some(Token {
            kind: TokenKind::Word(text) | TokenKind::Quoted(text),
            column,
        }) => Ok(Written { text, column }),
        Some(Token {
            kind: TokenKind::OpenBracket,
            column,
        }) => bad(format!(
            "filter: {what} takes one value, not a list, at column {column}; use in [...] for a list"
        )),
        Some(token) => bad(format!(
            "filter: {what} needs a value at column {}, found {}",
            token.column,
            token.describe()
        )),
        None => bad(format!("filter: {what} needs a value at column {}", tokens.end_column)),
    }
}

fn parse_list(field: Field, operator: Operator, tokens: &mut Tokens) -> Result<Vec<Written>, InputError> {
    let what = format!("{} {}", field.name(), operator.symbol());
    let open_column = match tokens.next() {
        Some(Token {
            kind: TokenKind::OpenBracket,
            column,
        }) => column,
        Some(token) => {
            return bad(format!(
                "filter: {what} needs a list such as [a, b] at column {}, found {}",
                token.column,
                token.describe()
            ));
        }
        None => {
            return bad(format!(
                "filter: {what} needs a list such as [a, b] at column {}",
                tokens.end_column
            ));
        }
    };
    let mut values = Vec::new();
    loop {
        match tokens.next() {
            Some(Token {
                kind: TokenKind::Word(text) | TokenKind::Quoted(text),
                column,
            }) => {
                if values.len() == FILTER_LIST_ITEMS_MAX {
                    return bad(format!(
                        "filter: more than {FILTER_LIST_ITEMS_MAX} values in the list at column {open_column}"
                    ));
                }
                values.push(Written { text, column });
            }
            Some(Token {
                kind: TokenKind::CloseBracket,
                column,
            }) if values.is_empty() => {
                // An empty list would admit nothing (in) or everything (notin): surely a slip.
                return bad(format!(
                    "filter: empty list at column {column}; give at least one value"
                ));
            }
            Some(token) => {
                return bad(format!(
                    "filter: expected a value in the list at column {}, found {}",
                    token.column,
                    token.describe()
                ));
            }
            None => return bad(format!("filter: unclosed \"[\" at column {open_column}")),
        }
        match tokens.next() {
            Some(Token {
                kind: TokenKind::Comma, ..
            }) => {}
            Some(Token {
                kind: TokenKind::CloseBracket,
                ..
            }) => return Ok(values),
            Some(token) => {
                return bad(format!(
                    "filter: expected \",\" or \"]\" at column {}, found {} (is the \"[\" at column {open_column} unclosed?)",
                    token.column,
                    token.describe()
                ));
            }
            None => return bad(format!("filter: unclosed \"[\" at column {open_column}")),
        }
    }
}

/// A plain decimal: an optional sign, digits, an optional fraction. Exponents, `inf` and `NaN`
/// are refused so that a typo never becomes a comparison with infinity.
fn parse_number(text: &str) -> Option<f64> {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    text.parse::<f64>().ok().filter(|value| value.is_finite())
}

fn bad<T>(message: impl Into<String>) -> Result<T, InputError> {
    Err(InputError(message.into()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// An 8×H100 node in Amsterdam selling all three tiers.
    fn offer() -> OfferView {
        OfferView {
            node_id: 7,
            provider_id: 3,
            gpu_model: "H100-SXM5".to_string(),
            gpu_count: 8,
            gpus_free: 4,
            gpu_memory_mib: 81_920,
            compute_units: 1.0,
            region: "eu-west".to_string(),
            site: "ams1".to_string(),
            reliability: 0.97,
            price_micros_per_gpu_hour: prices(&[("gold", 3_100_000), ("silver", 2_400_000), ("bronze", 1_200_000)]),
            online: true,
            simulated: false,
        }
    }

    fn prices(asks: &[(&str, i64)]) -> BTreeMap<String, i64> {
        asks.iter().map(|(tier, micros)| (tier.to_string(), *micros)).collect()
    }

    fn with_model(gpu_model: &str) -> OfferView {
        OfferView {
            gpu_model: gpu_model.to_string(),
            ..offer()
        }
    }

    fn with_prices(asks: &[(&str, i64)]) -> OfferView {
        OfferView {
            price_micros_per_gpu_hour: prices(asks),
            ..offer()
        }
    }

    #[track_caller]
    #[test]
    fn the_first_clause_an_offer_fails_is_named_as_written() {
        let filter = OfferFilter::parse("gpus_free>0  region in [us-east, eu-north] tier=gold").unwrap();
        assert_eq!(filter.excluded_by(&offer()), Some("region in [us-east, eu-north]"));
        let filter = OfferFilter::parse("region=eu-west price<1").unwrap();
        assert_eq!(filter.excluded_by(&offer()), Some("price<1"));
        assert_eq!(
            OfferFilter::parse("region=eu-west").unwrap().excluded_by(&offer()),
            None
        );
        assert_eq!(OfferFilter::parse("").unwrap().excluded_by(&offer()), None);
    }

    fn check(query: &str, offer: &OfferView, expect: bool) {
        let filter = OfferFilter::parse(query).unwrap_or_else(|error| panic!("{query:?} does not parse: {error}"));
        assert_eq!(filter.matches(offer), expect, "{query:?} on {offer:?}");
    }

    #[track_caller]
    fn check_error(query: &str, expect: &str) {
        match OfferFilter::parse(query) {
            Ok(filter) => panic!("{query:?} parsed as {filter:?}; expected the error {expect:?}"),
            Err(InputError(message)) => assert_eq!(message, expect, "{query:?}"),
        }
    }

    #[test]
    fn the_briefs_examples() {
        let eu_north = OfferView {
            region: "eu-north".to_string(),
            ..offer()
        };
        let a100 = OfferView {
            gpu_model: "A100-SXM4-80GB".to_string(),
            site: "fra2".to_string(),
            compute_units: 0.316,
            ..offer()
        };
        let rows: [(&str, &OfferView, bool); 10] = [
            ("", &offer(), true),
            ("   \t\n ", &offer(), true),
            (
                "gpu_model=H100 reliability>0.95 region in [eu-west,eu-north] price<2.5",
                &offer(),
                true,
            ),
            (
                "gpu_model=H100 reliability>0.95 region in [eu-west,eu-north] price<2.5",
                &eu_north,
                true,
            ),
            (
                "gpu_model=H100 reliability>0.98 region in [eu-west,eu-north] price<2.5",
                &offer(),
                false,
            ),
            ("gpus_free>=4 tier=gold price<=3.10 online=true", &offer(), true),
            ("gpus_free>=4 tier=gold price<3.10 online=true", &offer(), false),
            (
                "gpu_model in [H100-SXM5, A100-SXM4-80GB] site!=ams1 simulated=false compute_units>=0.5",
                &offer(),
                false,
            ),
            (
                "gpu_model in [H100-SXM5, A100-SXM4-80GB] site!=ams1 simulated=false compute_units>=0.3",
                &a100,
                true,
            ),
            (
                "gpu_model in [H100-SXM5, A100-SXM4-80GB] site!=ams1 simulated=false compute_units>=0.5",
                &a100,
                false,
            ),
        ];
        for (query, offer, expect) in rows {
            check(query, offer, expect);
        }
    }

    #[test]
    fn each_operator() {
        // gpus_free is 4.
        for (query, expect) in [
            ("gpus_free=4", true),
            ("gpus_free=3", false),
            ("gpus_free==4", true),
            ("gpus_free==5", false),
            ("gpus_free!=4", false),
            ("gpus_free!=3", true),
            ("gpus_free<5", true),
            ("gpus_free<4", false),
            ("gpus_free<=4", true),
            ("gpus_free<=3", false),
            ("gpus_free>3", true),
            ("gpus_free>4", false),
            ("gpus_free>=4", true),
            ("gpus_free>=5", false),
            ("gpus_free in [2, 4, 8]", true),
            ("gpus_free in [2, 8]", false),
            ("gpus_free notin [2, 8]", true),
            ("gpus_free notin [4]", false),
            ("gpus_free IN [4]", true),
            ("gpus_free NotIn [4]", false),
            ("region=eu-west", true),
            ("region==eu-west", true),
            ("region!=eu-west", false),
            ("region in [us-east, eu-west]", true),
            ("region notin [us-east, eu-west]", false),
            ("region notin [us-east]", true),
        ] {
            check(query, &offer(), expect);
        }
    }

    #[test]
    fn each_field() {
        for (query, expect) in [
            ("gpu_model=H100-SXM5", true),
            ("gpu_model=A100", false),
            ("gpu_count=8", true),
            ("gpu_count<8", false),
            ("gpus_free=4", true),
            ("gpus_free>4", false),
            ("gpu_memory_mib=81920", true),
            ("gpu_memory_mib>81920", false),
            ("gpu_memory_gb=80", true),
            ("gpu_memory_gb>=80.5", false),
            ("compute_units=1", true),
            ("compute_units>1.0", false),
            ("region=eu-west", true),
            ("region=eu", false),
            ("site=ams1", true),
            ("site=AMS1", true),
            ("site=ams", false),
            ("reliability>0.95", true),
            ("reliability>=0.98", false),
            ("online=true", true),
            ("online=false", false),
            ("simulated=false", true),
            ("simulated=true", false),
            ("node_id=7", true),
            ("node_id!=7", false),
            ("provider_id=3", true),
            ("provider_id in [1, 2]", false),
            ("price=1.2", true),
            ("price<1.2", false),
            ("tier=silver", true),
            ("tier in [silver, bronze]", true),
        ] {
            check(query, &offer(), expect);
        }
        check("tier=gold", &with_prices(&[("silver", 1)]), false);
    }

    #[test]
    fn field_names_and_words_ignore_case() {
        for (query, expect) in [
            ("GPU_MODEL=h100-sxm5", true),
            ("Online=TRUE", true),
            ("simulated=False", true),
            ("TIER=Gold", true),
            ("Region=EU-WEST", true),
        ] {
            check(query, &offer(), expect);
        }
    }

    #[test]
    fn gpu_model_matches_by_prefix_up_to_a_dash() {
        for (query, model, expect) in [
            ("gpu_model=H100", "H100-SXM5", true),
            ("gpu_model=H100", "H100-PCIe", true),
            ("gpu_model=h100", "H100-NVL", true),
            ("gpu_model=H100", "H100", true),
            ("gpu_model=A100-SXM4", "A100-SXM4-80GB", true),
            ("gpu_model=A100_80GB", "A100_80GB_SXM4", true),
            // Leading characters of a different GPU's name do not count.
            ("gpu_model=H20", "H200-SXM", false),
            ("gpu_model=L4", "L40", false),
            ("gpu_model=A10", "A100-SXM4-80GB", false),
            ("gpu_model=H100-SXM", "H100-SXM5", false),
            ("gpu_model=H100-SXM5-80GB", "H100-SXM5", false),
            ("gpu_model=\"\"", "H100-SXM5", false),
            ("gpu_model!=H100", "H100-PCIe", false),
            ("gpu_model!=H100", "A100-SXM4-80GB", true),
            ("gpu_model in [A100, H100]", "H100-PCIe", true),
            ("gpu_model in [A100, H200]", "H100-PCIe", false),
            ("gpu_model notin [A100, H100]", "H100-PCIe", false),
            ("gpu_model notin [A100, H200]", "H100-PCIe", true),
            // Non-ASCII model names compare by bytes without splitting a character.
            ("gpu_model=\"Ä\"", "Ä-1", true),
            ("gpu_model=\"A\"", "Ä-1", false),
        ] {
            check(query, &with_model(model), expect);
        }
    }

    #[test]
    fn price_reads_the_tiers_the_query_admits() {
        // gold $3.10, silver $2.40, bronze $1.20.
        for (query, expect) in [
            ("price=1.2", true),
            ("price<2", true),
            ("tier=gold price<2", false),
            ("tier=gold price=3.1", true),
            ("tier=gold price<=3.10", true),
            ("tier=gold price>3.0999", true),
            ("tier=silver price=2.4", true),
            ("price>2 tier=silver", true),
            ("tier in [gold, silver] price<2.5", true),
            ("tier in [gold, silver] price<2.4", false),
            ("tier in [gold, silver] tier in [gold, bronze] price=3.1", true),
            ("tier in [silver] tier in [gold] price>0", false),
        ] {
            check(query, &offer(), expect);
        }
        let silver_only = with_prices(&[("silver", 2_000_000)]);
        let unknown_tier_only = with_prices(&[("platinum", 500_000)]);
        let no_prices = with_prices(&[]);
        for (query, offer, expect) in [
            ("tier=gold", &silver_only, false),
            ("tier=gold price>0", &silver_only, false),
            ("tier=gold price!=1", &silver_only, false),
            ("price=2", &silver_only, true),
            ("price=0.5", &unknown_tier_only, true),
            ("tier in [gold, silver, bronze] price=0.5", &unknown_tier_only, false),
            ("", &no_prices, true),
            ("price>0", &no_prices, false),
            ("price<=0", &no_prices, false),
            ("price!=1", &no_prices, false),
            ("price notin [1]", &no_prices, false),
        ] {
            check(query, offer, expect);
        }
    }

    #[test]
    fn tier_is_the_one_named_with_equals() {
        for (query, expect) in [
            ("", None),
            ("price<2", None),
            ("tier=gold", Some("gold")),
            ("price<2 TIER == Silver", Some("silver")),
            ("tier in [bronze]", None),
            ("tier in [gold, silver] tier=silver", Some("silver")),
        ] {
            let filter = OfferFilter::parse(query).expect("parses");
            assert_eq!(filter.tier(), expect, "{query:?}");
        }
    }

    #[test]
    fn spaces_around_operators_and_in_lists() {
        for (query, expect) in [
            ("price < 2.5", true),
            ("price\t<=\t1.2", true),
            ("gpus_free >= 4  online = true", true),
            ("region in [ eu-west , eu-north ]", true),
            ("region in[eu-north,eu-west]", true),
            ("region notin [\n us-east,\n us-west\n]", true),
            ("gpu_model in [H100-SXM5, A100-SXM4-80GB]", true),
            ("price<-1", false),
            ("price>-1", true),
            ("price>.5", true),
            ("price>1.", true),
            ("price>\"+1\"", true),
        ] {
            check(query, &offer(), expect);
        }
    }

    #[test]
    fn quoted_strings() {
        let spaced = OfferView {
            region: "eu west".to_string(),
            site: "a\"b\\c".to_string(),
            ..offer()
        };
        for (query, expect) in [
            ("region=\"eu west\"", true),
            ("region=\"eu\"", false),
            ("region in [\"us east\", \"eu west\"]", true),
            ("site=\"a\\\"b\\\\c\"", true),
            ("site=\"a\"", false),
            ("price<\"2.5\"", true),
            ("online=\"true\"", true),
            ("region=\"eu west\"site=\"a\\\"b\\\\c\"", true),
        ] {
            check(query, &spaced, expect);
        }
    }

    #[test]
    fn error_messages_say_what_and_where() {
        let known = "gpu_model, gpus_free, gpu_count, gpu_memory_gb, gpu_memory_mib, compute_units, price, tier, \
                     reliability, region, site, online, simulated, node_id, provider_id";
        for (query, expect) in [
            (
                "gpu_modle=H100",
                format!("filter: unknown field \"gpu_modle\" at column 1; known fields: {known}"),
            ),
            (
                "site=\"ämsterdam\" bogus=1",
                format!("filter: unknown field \"bogus\" at column 18; known fields: {known}"),
            ),
            ("price<abc", "filter: \"abc\" is not a number for price at column 7".into()),
            ("price < \"\"", "filter: \"\" is not a number for price at column 9".into()),
            ("price<1e5", "filter: \"1e5\" is not a number for price at column 7".into()),
            ("price<nan", "filter: \"nan\" is not a number for price at column 7".into()),
            ("price>inf", "filter: \"inf\" is not a number for price at column 7".into()),
            ("price>-", "filter: \"-\" is not a number for price at column 7".into()),
            ("price>.", "filter: \".\" is not a number for price at column 7".into()),
            ("price>1.2.3", "filter: \"1.2.3\" is not a number for price at column 7".into()),
            ("price<2.5region=x", "filter: \"2.5region\" is not a number for price at column 7".into()),
            (
                "gpu_count in [1, two]",
                "filter: \"two\" is not a number for gpu_count at column 18".into(),
            ),
            (
                &format!("price<1{}", "0".repeat(400)),
                format!("filter: \"1{}\" is not a number for price at column 7", "0".repeat(400)),
            ),
            ("gpus_free>=4 tier=gold region in [eu-west", "filter: unclosed \"[\" at column 34".into()),
            ("region in [", "filter: unclosed \"[\" at column 11".into()),
            ("region in [eu-west,", "filter: unclosed \"[\" at column 11".into()),
            (
                "region<eu",
                "filter: operator < does not apply to region (a name) at column 7; use = != in notin".into(),
            ),
            (
                "gpu_model >= H100",
                "filter: operator >= does not apply to gpu_model (a name) at column 11; use = != in notin".into(),
            ),
            (
                "online>false",
                "filter: operator > does not apply to online (true or false) at column 7; use = !=".into(),
            ),
            (
                "simulated in [true]",
                "filter: operator in does not apply to simulated (true or false) at column 11; use = !=".into(),
            ),
            (
                "tier!=gold",
                "filter: operator != does not apply to tier (a tier) at column 5; use = in".into(),
            ),
            (
                "tier notin [gold]",
                "filter: operator notin does not apply to tier (a tier) at column 6; use = in".into(),
            ),
            ("online=yes", "filter: \"yes\" is not true or false for online at column 8".into()),
            (
                "tier in [gold, platinum]",
                "filter: \"platinum\" is not a tier (gold, silver or bronze) at column 16".into(),
            ),
            (
                "tier=gold price<2 tier=silver",
                "filter: tier= given twice, at columns 1 and 19; use tier in [...] for several".into(),
            ),
            ("price<", "filter: price < needs a value at column 7".into()),
            ("price< region=x", "filter: \"region\" is not a number for price at column 8".into()),
            (
                "price",
                "filter: expected an operator after price at column 6; use = == != < <= > >= in notin".into(),
            ),
            (
                "price 2.5",
                "filter: expected an operator after price at column 7, found \"2.5\"; use = == != < <= > >= in notin"
                    .into(),
            ),
            (
                "price=<2",
                "filter: price = needs a value at column 7, found \"<\"".into(),
            ),
            ("=5", "filter: expected a field name at column 1, found \"=\"".into()),
            (
                "\"price\"<2",
                "filter: expected a field name at column 1, found the string \"price\"".into(),
            ),
            ("price<2 ,", "filter: expected a field name at column 9, found \",\"".into()),
            (
                "region=[eu-west]",
                "filter: region = takes one value, not a list, at column 8; use in [...] for a list".into(),
            ),
            (
                "region in eu-west",
                "filter: region in needs a list such as [a, b] at column 11, found \"eu-west\"".into(),
            ),
            ("region in", "filter: region in needs a list such as [a, b] at column 10".into()),
            (
                "region in []",
                "filter: empty list at column 12; give at least one value".into(),
            ),
            (
                "region in [eu-west,]",
                "filter: expected a value in the list at column 20, found \"]\"".into(),
            ),
            (
                "region in [eu-west eu-north]",
                "filter: expected \",\" or \"]\" at column 20, found \"eu-north\" (is the \"[\" at column 11 unclosed?)"
                    .into(),
            ),
            ("site=\"ams1", "filter: unclosed '\"' at column 6".into()),
            ("site=\"ams1\\", "filter: unclosed '\"' at column 6".into()),
            (
                "site!ams1",
                "filter: \"!\" at column 5 must be followed by \"=\" (!=)".into(),
            ),
            (
                "price<2.5 & region=x",
                "filter: unexpected character '&' at column 11; put values that contain it in double quotes".into(),
            ),
            (
                "region=ämsterdam",
                "filter: unexpected character 'ä' at column 8; put values that contain it in double quotes".into(),
            ),
        ] {
            check_error(query, &expect);
        }
    }

    #[test]
    fn limits_are_named_and_checked() {
        let longest = format!("site={}", "a".repeat(FILTER_BYTES_MAX - 5));
        assert_eq!(longest.len(), FILTER_BYTES_MAX);
        check(&longest, &offer(), false);
        check_error(
            &format!("{longest} "),
            &format!("filter: longer than {FILTER_BYTES_MAX} bytes (2049 given)"),
        );

        let clauses = |count: usize| vec!["gpus_free>0"; count].join(" ");
        check(&clauses(FILTER_CLAUSES_MAX), &offer(), true);
        let column = FILTER_CLAUSES_MAX * "gpus_free>0 ".len() + 1;
        check_error(
            &clauses(FILTER_CLAUSES_MAX + 1),
            &format!("filter: more than {FILTER_CLAUSES_MAX} clauses (the next starts at column {column})"),
        );

        let list = |count: usize| {
            let items: Vec<String> = (0..count).map(|item| item.to_string()).collect();
            format!("node_id in [{}]", items.join(","))
        };
        check(&list(FILTER_LIST_ITEMS_MAX), &offer(), true);
        check_error(
            &list(FILTER_LIST_ITEMS_MAX + 1),
            &format!("filter: more than {FILTER_LIST_ITEMS_MAX} values in the list at column 12"),
        );
    }

    /// The language's tokens, right and wrong, for building near-miss queries.
    const TOKENS: &[&str] = &[
        "gpu_model",
        "gpus_free",
        "gpu_count",
        "gpu_memory_gb",
        "gpu_memory_mib",
        "compute_units",
        "price",
        "tier",
        "reliability",
        "region",
        "site",
        "online",
        "simulated",
        "node_id",
        "provider_id",
        "bogus",
        "=",
        "==",
        "!=",
        "!",
        "<",
        "<=",
        ">",
        ">=",
        "in",
        "notin",
        "[",
        "]",
        ",",
        "\"",
        "\"eu west\"",
        "\\",
        "H100",
        "H20",
        "-",
        ".",
        "0",
        "0.5",
        "2.5",
        "-1",
        ".5",
        "1e5",
        "NaN",
        "true",
        "false",
        "gold",
        "silver",
        "bronze",
        "eu-west",
        "ä",
        "\u{0}",
    ];

    fn any_offer() -> impl Strategy<Value = OfferView> {
        let tiers = prop::sample::select(vec!["gold", "silver", "bronze", "platinum", ""]).prop_map(String::from);
        (
            (
                any::<i64>(),
                any::<i64>(),
                "[A-Za-z0-9_ä-]{0,12}",
                any::<u8>(),
                any::<u8>(),
                any::<u32>(),
            ),
            (
                any::<f64>(),
                "[a-z -]{0,8}",
                "\\PC{0,5}",
                any::<f64>(),
                prop::collection::btree_map(tiers, any::<i64>(), 0..5),
                any::<bool>(),
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    (node_id, provider_id, gpu_model, gpu_count, gpus_free, gpu_memory_mib),
                    (compute_units, region, site, reliability, price_micros_per_gpu_hour, online, simulated),
                )| OfferView {
                    node_id,
                    provider_id,
                    gpu_model,
                    gpu_count,
                    gpus_free,
                    gpu_memory_mib,
                    compute_units,
                    region,
                    site,
                    reliability,
                    price_micros_per_gpu_hour,
                    online,
                    simulated,
                },
            )
    }

    fn token_query() -> impl Strategy<Value = String> {
        let piece = (
            prop::sample::select(TOKENS),
            prop::sample::select(&["", " ", "  ", "\t"][..]),
        );
        prop::collection::vec(piece, 0..48).prop_map(|pieces| {
            pieces
                .into_iter()
                .map(|(token, space)| format!("{token}{space}"))
                .collect::<String>()
        })
    }

    /// Clauses shaped like the grammar (field, operator, one value or a list) but with fields,
    /// operators and values drawn independently, so that many parse and many fail late.
    fn clause_query() -> impl Strategy<Value = String> {
        let fields: Vec<&str> = FIELDS.iter().map(|(name, _)| *name).chain(["bogus"]).collect();
        let field = prop::sample::select(fields);
        let operator = prop::sample::select(&["=", "==", "!=", "<", "<=", ">", ">=", "in", "notin"][..]);
        let value = prop::sample::select(
            &[
                "H100",
                "H20",
                "eu-west",
                "\"eu west\"",
                "0",
                "0.5",
                "2.5",
                "-1",
                ".5",
                "1e5",
                "NaN",
                "true",
                "false",
                "gold",
                "silver",
                "bronze",
                "-",
                ".",
                "\"\"",
                "ä",
            ][..],
        );
        let values = prop::collection::vec(value, 1..4);
        let clause = (field, operator, values).prop_map(|(field, operator, values)| {
            if matches!(operator, "in" | "notin") {
                format!("{field} {operator} [{}]", values.join(", "))
            } else {
                format!("{field}{operator}{}", values[0])
            }
        });
        prop::collection::vec(clause, 0..6).prop_map(|clauses| clauses.join(" "))
    }

    /// A number field and a plain decimal to compare it with.
    fn numeric_clause() -> impl Strategy<Value = (&'static str, String)> {
        let fields = prop::sample::select(vec![
            "gpu_count",
            "gpus_free",
            "gpu_memory_mib",
            "gpu_memory_gb",
            "compute_units",
            "reliability",
            "node_id",
            "provider_id",
            "price",
        ]);
        let value = prop_oneof![
            (0u32..200_000, 0u32..1000).prop_map(|(whole, thousandths)| format!("{whole}.{thousandths:03}")),
            (0u32..10).prop_map(|small| small.to_string()),
            (0u32..4).prop_map(|tenths| format!("0.{tenths}")),
        ];
        (fields, value)
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(query in any::<String>(), offer in any_offer()) {
            if let Ok(filter) = OfferFilter::parse(&query) {
                let _ = filter.matches(&offer);
                let _ = filter.tier();
            }
        }

        #[test]
        fn long_printable_text_never_panics(query in "\\PC{0,3000}", offer in any_offer()) {
            if let Ok(filter) = OfferFilter::parse(&query) {
                prop_assert!(query.len() <= FILTER_BYTES_MAX);
                let _ = filter.matches(&offer);
            }
        }

        #[test]
        fn token_soup_never_panics_and_errors_say_filter(
            query in prop_oneof![token_query(), clause_query()],
            offer in any_offer(),
        ) {
            match OfferFilter::parse(&query) {
                Ok(filter) => {
                    let _ = filter.matches(&offer);
                    let _ = filter.tier();
                }
                Err(InputError(message)) => prop_assert!(message.starts_with("filter: "), "{message}"),
            }
        }

        /// For an offer whose numbers are not NaN, exactly one of <, = and > holds, `!=` is the
        /// opposite of `=`, and `<=` is `<` or `=`; with no price in the admitted tiers, none holds.
        #[test]
        fn number_comparisons_are_consistent(
            (field, value) in numeric_clause(),
            reliability in 0.0..=1.0f64,
            compute_units in 0.0..64.0f64,
            asks in prop::collection::btree_map(
                prop::sample::select(vec!["gold", "silver", "bronze"]).prop_map(String::from),
                0i64..5_000_000,
                0..4,
            ),
        ) {
            let offer = OfferView { reliability, compute_units, price_micros_per_gpu_hour: asks, ..offer() };
            let holds = |operator: &str| {
                OfferFilter::parse(&format!("{field} {operator} {value}")).expect("valid clause").matches(&offer)
            };
            let has_value = field != "price" || !offer.price_micros_per_gpu_hour.is_empty();
            let count = ["<", "=", ">"].into_iter().filter(|operator| holds(operator)).count();
            prop_assert_eq!(count, usize::from(has_value));
            prop_assert_eq!(holds("!="), has_value && !holds("="));
            prop_assert_eq!(holds("<="), holds("<") || holds("="));
            prop_assert_eq!(holds(">="), holds(">") || holds("="));
            let listed = OfferFilter::parse(&format!("{field} in [-1, {value}]")).expect("valid clause").matches(&offer);
            prop_assert_eq!(listed, holds("="));
        }

        /// `gpu_model=X` and `gpu_model!=X` are opposites, and `=` admits the offer's own model.
        #[test]
        fn gpu_model_equal_and_not_equal_are_opposites(model in "[A-Za-z0-9_-]{1,12}", value in "[A-Za-z0-9_-]{1,12}") {
            let offer = with_model(&model);
            let equal = OfferFilter::parse(&format!("gpu_model={value}")).expect("valid").matches(&offer);
            let not_equal = OfferFilter::parse(&format!("gpu_model!={value}")).expect("valid").matches(&offer);
            prop_assert_ne!(equal, not_equal);
            let itself = OfferFilter::parse(&format!("gpu_model=\"{model}\"")).expect("valid").matches(&offer);
            prop_assert!(itself);
        }
    }
}
