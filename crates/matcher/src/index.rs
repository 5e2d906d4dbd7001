//! Capacity indexes. Nodes are laid out in two orders — by (model, key) and by
//! (region, model, key), where the key is the node's effective ask per compute unit — so that
//! every model, and every (region, model) pair, is a contiguous range of ranks. There are two
//! such pairs of orders, two keyings, where providers discount interruptible work by different
//! shares: firm work (gold, silver) is searched in nodes keyed by their reference ask, bronze
//! in nodes keyed by their bronze ask, so that each tier's bound on a node's ask is tight. For each
//! capacity level (whole GPUs free: 1..=16; best free share on a shared GPU: 10 buckets) a
//! [`RankSet`] holds the ranks of the nodes at that level. "The cheapest node in region r with
//! model m and exactly 3 whole GPUs free" is one `next_at_or_after` on one set.

use std::ops::Range;

use model::{GPUS_PER_NODE_MAX, Tier};

use crate::rankset::{RankSet, has_bit, set_bit};
use crate::state::{NodeLoad, NodeStatic, effective_ask};

pub(crate) const WHOLE_LEVELS: usize = GPUS_PER_NODE_MAX + 1;
pub(crate) const SHARE_BUCKETS: usize = 11;
/// Which tiers a node hosts: bit 0 bronze, bit 1 gold or silver. Sets are split by it so the
/// search can bound the penalty for mixing tiers.
pub(crate) const TIER_CLASSES: usize = 4;
/// Reliability floors with a static filter over each order's ranks: a job's floor uses the
/// highest step at or under it, so nodes below the step are passed over by the word.
pub(crate) const RELIABILITY_STEPS_PPM: [u32; 5] = [800_000, 900_000, 950_000, 980_000, 990_000];
/// Ask steps per range (quantiles of its nodes' reference asks), each with a static filter:
/// a price cap uses the lowest step at or over it, so the nodes it rules out are mostly
/// passed over by the word.
pub(crate) const ASK_STEPS: usize = 8;
/// Open-time classes: a node is in class c when its availability window stays open at least
/// `WINDOW_CLASSES_S[c - 1]` seconds from the matcher's clock minute (class `WINDOW_CLASSES`:
/// always open, or windows the cached minute does not describe). Work that cannot be interrupted
/// filters by the highest class at or under its runtime, so the labs whose night ends before it
/// would are passed over by the word instead of node by node.
pub(crate) const WINDOW_CLASSES_S: [i64; 12] = [
    1800,
    3600,
    2 * 3600,
    3 * 3600,
    4 * 3600,
    6 * 3600,
    8 * 3600,
    12 * 3600,
    16 * 3600,
    24 * 3600,
    32 * 3600,
    48 * 3600,
];
pub(crate) const WINDOW_CLASSES: u8 = WINDOW_CLASSES_S.len() as u8;

/// The open-time class of a window that stays open `open_s` seconds more (see [`WINDOW_CLASSES_S`]).
pub(crate) fn window_class(open_s: i64) -> u8 {
    WINDOW_CLASSES_S
        .iter()
        .take_while(|&&class_s| open_s >= class_s)
        .count() as u8
}

/// The filter class for work that must stay `runtime_s` seconds: the highest class at or under it
/// (`None`: no class is that short, every node passes).
pub(crate) fn window_filter_class(runtime_s: i64) -> Option<usize> {
    WINDOW_CLASSES_S.iter().rposition(|&class_s| class_s <= runtime_s)
}

/// A node's place in the sets: (whole GPUs free, share bucket, tier class).
pub(crate) type Levels = (u8, u8, u8);

/// The first member of a set in a range, with its key, so that opening a lane touches
/// neither the bitmap nor the rank entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct First {
    pub rank: u32,
    pub key: u64,
}

const NO_FIRST: First = First {
    rank: u32::MAX,
    key: u64::MAX,
};

/// A node as the search first sees it: its effective-ask key (the bound), a lower bound of its
/// ask for the order's tier at any time, and its reliability, so that nodes over the price cap
/// or under the reliability floor are skipped without touching the node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RankEntry {
    pub key: u64,
    /// The ask the node is keyed by: a tier's ask is at least this × the keying's ratio bound
    /// for the tier.
    pub reference_ask: i64,
    pub node: u32,
    pub reliability_ppm: u32,
}

/// One node order with its level sets.
#[derive(Clone, Debug)]
pub(crate) struct Order {
    /// rank → node
    pub nodes: Vec<u32>,
    /// node → rank
    pub ranks: Vec<u32>,
    /// rank → what the search reads about a node before touching it, in one cache line.
    pub entries: Vec<RankEntry>,
    /// `whole[f × 4 + c]`: nodes of tier class c with exactly f whole GPUs free (f ≥ 1).
    pub whole: Vec<RankSet>,
    /// `share[b × 4 + c]`: nodes of tier class c whose best partly used GPU has a free share in bucket b (b ≥ 1).
    pub share: Vec<RankSet>,
    /// rank → its range (the run of ranks with the same group: model, or region and model),
    /// and each range's first rank.
    range_of_rank: Vec<u16>,
    range_starts: Vec<u32>,
    /// Static filters over ranks, one bit per rank as in a set's bottom level:
    /// `selling[t × (steps + 1) + k]`: sells tier t, with reliability at least
    /// `RELIABILITY_STEPS_PPM[k - 1]` (k = 0: any reliability); `ask_within[k]`: reference ask
    /// at most the `k`-th ask step of the rank's range; `everyone`: every rank.
    selling: Vec<Vec<u64>>,
    ask_within: Vec<Vec<u64>>,
    everyone: Vec<u64>,
    /// A dynamic filter: `open_for[c]` holds the ranks of nodes in open-time class above c (see
    /// [`WINDOW_CLASSES_S`]), kept by the clock.
    open_for: Vec<Vec<u64>>,
    /// `whole_firsts[range × slots + slot]`: the first member of `whole[slot]` in the range, kept on
    /// every change so that opening a lane costs no bitmap search (`u32::MAX` = none).
    whole_firsts: Vec<First>,
    share_firsts: Vec<First>,
}

impl Order {
    /// Nodes ordered by (group, key), with `keyed[node]` the node's (key, ask the key is of).
    fn build(statics: &[NodeStatic], loads: &[NodeLoad], keyed: &[Keyed], group: impl Fn(usize) -> u64) -> Order {
        let mut nodes: Vec<u32> = (0..statics.len() as u32).collect();
        nodes.sort_by_key(|&node| (group(node as usize), keyed[node as usize].key, node));
        let mut ranks = vec![0u32; statics.len()];
        for (rank, &node) in nodes.iter().enumerate() {
            ranks[node as usize] = rank as u32;
        }
        let entries: Vec<RankEntry> = nodes
            .iter()
            .map(|&node| RankEntry {
                key: keyed[node as usize].key,
                reference_ask: keyed[node as usize].ask,
                node,
                reliability_ppm: statics[node as usize].reliability_ppm,
            })
            .collect();
        let mut range_of_rank = Vec::with_capacity(nodes.len());
        let mut range_starts: Vec<u32> = Vec::new();
        let mut previous_group = None;
        for (rank, &node) in nodes.iter().enumerate() {
            let group = group(node as usize);
            if previous_group != Some(group) {
                previous_group = Some(group);
                range_starts.push(rank as u32);
            }
            range_of_rank.push(u16::try_from(range_starts.len() - 1).expect("at most 65,536 ranges in an order"));
        }
        let ranges = range_starts.len();
        let words = nodes.len().div_ceil(64).max(1);
        let filter = |keep: &dyn Fn(&RankEntry) -> bool| {
            let mut bits = vec![0u64; words];
            for (rank, entry) in entries.iter().enumerate() {
                if keep(entry) {
                    set_bit(&mut bits, rank);
                }
            }
            bits
        };
        let selling = (0..3usize)
            .flat_map(|tier| {
                std::iter::once(0)
                    .chain(RELIABILITY_STEPS_PPM)
                    .map(move |step| (tier, step))
            })
            .map(|(tier, step)| {
                filter(&|entry| {
                    statics[entry.node as usize].tiers & (1 << tier) != 0
                        && statics[entry.node as usize].asks[tier] != i64::MAX
                        && entry.reliability_ppm >= step
                })
            })
            .collect();
        let everyone = filter(&|_| true);
        let mut order = Order {
            selling,
            open_for: vec![everyone.clone(); WINDOW_CLASSES as usize],
            ask_within: vec![vec![0u64; words]; ASK_STEPS],
            everyone,
            entries,
            whole: (0..WHOLE_LEVELS * TIER_CLASSES)
                .map(|_| RankSet::new(statics.len()))
                .collect(),
            share: (0..SHARE_BUCKETS * TIER_CLASSES)
                .map(|_| RankSet::new(statics.len()))
                .collect(),
            nodes,
            ranks,
            range_of_rank,
            range_starts,
            whole_firsts: vec![NO_FIRST; ranges * WHOLE_LEVELS * TIER_CLASSES],
            share_firsts: vec![NO_FIRST; ranges * SHARE_BUCKETS * TIER_CLASSES],
        };
        for (node, load) in loads.iter().enumerate() {
            order.set(node, (load.whole_free, load.share_bucket, load.tier_class), true);
        }
        order
    }

    fn set(&mut self, node: usize, (whole, bucket, class): Levels, present: bool) {
        let rank = self.ranks[node] as usize;
        let class = class as usize;
        let range = self.range_of_rank[rank] as usize;
        let range_end = self
            .range_starts
            .get(range + 1)
            .map_or(self.nodes.len(), |start| *start as usize);
        for (level, sets, firsts, slots) in [
            (
                whole as usize,
                &mut self.whole,
                &mut self.whole_firsts,
                WHOLE_LEVELS * TIER_CLASSES,
            ),
            (
                bucket as usize,
                &mut self.share,
                &mut self.share_firsts,
                SHARE_BUCKETS * TIER_CLASSES,
            ),
        ] {
            if level == 0 {
                continue;
            }
            let slot = level * TIER_CLASSES + class;
            let set = &mut sets[slot];
            let first = &mut firsts[range * slots + slot];
            let entries = &self.entries;
            let at = |rank: usize| First {
                rank: rank as u32,
                key: entries[rank].key,
            };
            if present {
                set.insert(rank);
                if (rank as u32) < first.rank {
                    *first = at(rank);
                }
            } else {
                set.remove(rank);
                if first.rank == rank as u32 {
                    *first = set
                        .next_at_or_after(rank + 1)
                        .filter(|next| *next < range_end)
                        .map_or(NO_FIRST, at);
                }
            }
        }
    }

    /// Moves a node from one open-time class to another in the `open_for` filters.
    fn set_window_class(&mut self, node: usize, from: u8, to: u8) {
        let rank = self.ranks[node] as usize;
        let (low, high) = (from.min(to) as usize, from.max(to) as usize);
        for bits in &mut self.open_for[low..high] {
            if to > from {
                set_bit(bits, rank);
            } else {
                bits[rank / 64] &= !(1 << (rank % 64));
            }
        }
    }

    /// Sets each range's ask steps (quantiles of its reference asks) and fills the ask filters.
    /// `ranges` are this order's ranges.
    fn set_ask_steps<'a>(&mut self, ranges: impl Iterator<Item = &'a mut RangeInfo>) {
        for range in ranges {
            let ranks = range.ranks.start as usize..range.ranks.end as usize;
            let mut asks: Vec<i64> = self.entries[ranks.clone()]
                .iter()
                .map(|entry| entry.reference_ask)
                .collect();
            asks.sort_unstable();
            for (step, ask) in range.ask_steps.iter_mut().enumerate() {
                *ask = asks[((step + 1) * asks.len()).div_ceil(ASK_STEPS) - 1];
            }
            for rank in ranks {
                for (step, bits) in self.ask_within.iter_mut().enumerate() {
                    if self.entries[rank].reference_ask <= range.ask_steps[step] {
                        set_bit(bits, rank);
                    }
                }
            }
        }
    }

    /// Checks the static filters and each range's ask steps against the rank entries (for
    /// `consistency_check`).
    /// `window_classes[node]` is each node's open-time class.
    pub fn check_filters<'a>(
        &self,
        ranges: impl Iterator<Item = &'a RangeInfo>,
        statics: &[NodeStatic],
        window_classes: &[u8],
    ) -> Result<(), String> {
        for range in ranges {
            let ranks = range.ranks.start as usize..range.ranks.end as usize;
            let highest = self.entries[ranks.clone()]
                .iter()
                .map(|entry| entry.reference_ask)
                .max();
            if !range.ask_steps.is_sorted() || range.ask_steps.last().copied() != highest {
                return Err(format!(
                    "range {ranks:?}: ask steps {:?} out of order or short of {highest:?}",
                    range.ask_steps
                ));
            }
            for rank in ranks {
                let entry = &self.entries[rank];
                let node = &statics[entry.node as usize];
                let selling = (0..3usize).flat_map(|tier| {
                    std::iter::once(0).chain(RELIABILITY_STEPS_PPM).map(move |step| {
                        node.tiers & (1 << tier) != 0 && node.asks[tier] != i64::MAX && entry.reliability_ppm >= step
                    })
                });
                let within = range.ask_steps.iter().map(|&ask| entry.reference_ask <= ask);
                let kept = self
                    .selling
                    .iter()
                    .chain(&self.ask_within)
                    .map(|bits| has_bit(bits, rank));
                let class = window_classes[entry.node as usize] as usize;
                let open = self
                    .open_for
                    .iter()
                    .enumerate()
                    .all(|(filter_class, bits)| has_bit(bits, rank) == (filter_class < class));
                if !selling.chain(within).eq(kept) || !has_bit(&self.everyone, rank) || !open {
                    return Err(format!(
                        "rank {rank}: the static filters disagree with its entry {entry:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The static filter for a tier and a reliability floor: the ranks of nodes that sell the
    /// tier, a superset of those that also meet the floor.
    pub fn selling_filter(&self, tier: usize, floor_ppm: u32) -> &[u64] {
        let step = RELIABILITY_STEPS_PPM
            .iter()
            .rposition(|&step| step <= floor_ppm)
            .map_or(0, |step| step + 1);
        &self.selling[tier * (RELIABILITY_STEPS_PPM.len() + 1) + step]
    }

    /// The window filter for work that must stay `runtime_s` seconds from the clock minute: a
    /// superset of the ranks whose window covers it. `None`: no filter (every rank).
    pub fn window_filter(&self, runtime_s: Option<i64>) -> &[u64] {
        match runtime_s.and_then(window_filter_class) {
            Some(class) => &self.open_for[class],
            None => &self.everyone,
        }
    }

    /// The static filter for a cap on the reference ask in one range: a superset of the range's
    /// ranks under the cap.
    pub fn ask_filter(&self, range: &RangeInfo, reference_ask_max: i64) -> &[u64] {
        match range.ask_steps.iter().position(|&ask| ask >= reference_ask_max) {
            Some(step) if step + 1 < ASK_STEPS => &self.ask_within[step],
            _ => &self.everyone,
        }
    }

    /// The first member of a set in a range, from the kept table. `share` picks the share sets.
    pub fn first_in_range(&self, share: bool, slot: usize, range: u16) -> Option<First> {
        let (firsts, slots) = if share {
            (&self.share_firsts, SHARE_BUCKETS * TIER_CLASSES)
        } else {
            (&self.whole_firsts, WHOLE_LEVELS * TIER_CLASSES)
        };
        let first = firsts[range as usize * slots + slot];
        (first.rank != u32::MAX).then_some(first)
    }

    /// Checks the kept first-member tables against the sets (for `consistency_check`).
    pub fn check_firsts(&self) -> Result<(), String> {
        for (share, sets, firsts) in [
            (false, &self.whole, &self.whole_firsts),
            (true, &self.share, &self.share_firsts),
        ] {
            for (slot, set) in sets.iter().enumerate() {
                for (range, &start) in self.range_starts.iter().enumerate() {
                    let end = self
                        .range_starts
                        .get(range + 1)
                        .map_or(self.nodes.len(), |next| *next as usize);
                    let expected = set.next_at_or_after(start as usize).filter(|rank| *rank < end);
                    let kept = firsts[range * sets.len() + slot];
                    let kept_rank = (kept.rank != u32::MAX).then_some(kept.rank as usize);
                    if kept_rank != expected || kept_rank.is_some_and(|rank| self.entries[rank].key != kept.key) {
                        return Err(format!(
                            "first of {} set {slot} in range {range} is {kept_rank:?}, not {expected:?}",
                            if share { "share" } else { "whole" }
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The range id of a rank.
    pub fn range_of(&self, rank: u32) -> u16 {
        self.range_of_rank[rank as usize]
    }

    /// The sets of one whole-GPU level, one per tier class.
    pub fn whole_sets(&self, level: usize) -> &[RankSet] {
        &self.whole[level * TIER_CLASSES..(level + 1) * TIER_CLASSES]
    }

    /// The sets of one share bucket, one per tier class.
    pub fn share_sets(&self, bucket: usize) -> &[RankSet] {
        &self.share[bucket * TIER_CLASSES..(bucket + 1) * TIER_CLASSES]
    }
}

/// A contiguous range of ranks holding one model (and region), with facts for pruning it whole.
#[derive(Clone, Debug, Default)]
pub(crate) struct RangeInfo {
    pub ranks: Range<u32>,
    pub model: u16,
    /// Lowest base ask per tier in the range (a price cap below it rules the range out).
    pub ask_min: [i64; 3],
    pub gpu_count_max: u8,
    /// Least `cu_milli × reliability_weight_ppm` in the range: a node's key is at most its
    /// reference ask × 10⁹ over this, so a price cap bounds the keys worth walking.
    pub cu_weight_min: u64,
    /// Quantiles of the range's reference asks, lowest first (see [`Order::ask_filter`]).
    pub ask_steps: [i64; ASK_STEPS],
}

impl RangeInfo {
    /// The largest key a node of the range can have with its reference ask at most `reference_ask_max`.
    pub fn key_max(&self, reference_ask_max: i64) -> u64 {
        let most = u128::from(reference_ask_max.max(0) as u64) * 1_000_000_000 / u128::from(self.cu_weight_min.max(1));
        u64::try_from(most).unwrap_or(u64::MAX)
    }
}

/// A node's key in one keying and the ask it is the effective ask of.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keyed {
    pub key: u64,
    pub ask: i64,
}

/// The two orders of one keying, their ranges, and how far a tier's ask can fall below the ask
/// the nodes are keyed by.
#[derive(Clone, Debug)]
pub(crate) struct Keying {
    pub by_model: Order,
    pub by_region_model: Order,
    /// Ranges of `by_model`, one per model present.
    pub model_ranges: Vec<RangeInfo>,
    /// Ranges of `by_region_model`: `region_ranges[r]` lists that region's model ranges.
    pub region_ranges: Vec<Vec<RangeInfo>>,
    /// Per tier, the lowest ratio of a node's ask for the tier to the ask it is keyed by, times
    /// the lowest price-rule multiplier: key × this bounds any node's effective ask for the tier.
    pub tier_ratio_permille: [u64; 3],
}

impl Keying {
    fn build(statics: &[NodeStatic], loads: &[NodeLoad], regions: usize, keyed: &[Keyed]) -> Keying {
        let mut by_model = Order::build(statics, loads, keyed, |node| u64::from(statics[node].model));
        let mut by_region_model = Order::build(statics, loads, keyed, |node| {
            (u64::from(statics[node].region) << 16) | u64::from(statics[node].model)
        });
        let mut model_ranges = ranges(&by_model.nodes, statics, |node| statics[node].model as usize);
        let mut region_ranges = vec![Vec::new(); regions];
        for range in ranges(&by_region_model.nodes, statics, |node| {
            ((statics[node].region as usize) << 16) | statics[node].model as usize
        }) {
            let first = by_region_model.nodes[range.ranks.start as usize] as usize;
            let region = statics[first].region as usize;
            if region >= region_ranges.len() {
                region_ranges.resize(region + 1, Vec::new());
            }
            region_ranges[region].push(range);
        }
        by_model.set_ask_steps(model_ranges.iter_mut());
        by_region_model.set_ask_steps(region_ranges.iter_mut().flatten());
        let ask_floor_permille_min = statics.iter().map(|node| node.ask_floor_permille).min().unwrap_or(1000);
        let tier_ratio_permille = [0usize, 1, 2].map(|tier| {
            let ratio = statics
                .iter()
                .zip(keyed)
                .filter(|(node, keyed)| node.tiers & (1 << tier) != 0 && node.asks[tier] != i64::MAX && keyed.ask > 0)
                .map(|(node, keyed)| share_permille(node.asks[tier], keyed.ask))
                .min()
                .unwrap_or(1000);
            ratio * u64::from(ask_floor_permille_min) / 1000
        });
        Keying {
            by_model,
            by_region_model,
            model_ranges,
            region_ranges,
            tier_ratio_permille,
        }
    }

    /// Both orders, with their names and ranges.
    pub fn orders(&self) -> [(&'static str, &Order, Vec<&RangeInfo>); 2] {
        [
            ("by_model", &self.by_model, self.model_ranges.iter().collect()),
            (
                "by_region_model",
                &self.by_region_model,
                self.region_ranges.iter().flatten().collect(),
            ),
        ]
    }
}

/// Bronze asks that are the same share of every node's reference ask, to within this (per
/// mille of the lowest share), are searched in the firm keying: its bound is then tight for
/// bronze too, and a second keying would only double the cost of every capacity change.
const BRONZE_SHARE_SPREAD_PERMILLE: u64 = 10;

#[derive(Clone, Debug)]
pub(crate) struct Index {
    /// Nodes keyed by their reference ask (silver, else the lowest sold): for gold and silver,
    /// and for bronze when `bronze` is `None`.
    pub firm: Keying,
    /// Nodes keyed by their bronze ask (those that do not sell bronze, by the reference ask),
    /// when providers discount bronze by different shares of their reference ask.
    pub bronze: Option<Keying>,
}

impl Index {
    pub fn build(statics: &[NodeStatic], loads: &[NodeLoad], regions: usize) -> Index {
        let reference: Vec<Keyed> = statics
            .iter()
            .map(|node| Keyed {
                key: node.reference_key,
                ask: node.reference_ask,
            })
            .collect();
        let bronze = Tier::Bronze as usize;
        let sells_bronze = |node: &NodeStatic| node.tiers & (1 << bronze) != 0 && node.asks[bronze] != i64::MAX;
        let shares = statics
            .iter()
            .filter(|node| sells_bronze(node) && node.reference_ask > 0)
            .map(|node| share_permille(node.asks[bronze], node.reference_ask));
        let (lowest, highest) = shares.fold((u64::MAX, 0), |(lowest, highest), share| {
            (lowest.min(share), highest.max(share))
        });
        let spread = highest > lowest && (highest - lowest) * 1000 > lowest.max(1) * BRONZE_SHARE_SPREAD_PERMILLE;
        let bronze_keying = spread.then(|| {
            let by_bronze: Vec<Keyed> = statics
                .iter()
                .zip(&reference)
                .map(|(node, reference)| {
                    if sells_bronze(node) {
                        Keyed {
                            key: effective_ask(node.asks[bronze], node.cu_milli, node.reliability_weight_ppm),
                            ask: node.asks[bronze],
                        }
                    } else {
                        *reference
                    }
                })
                .collect();
            Keying::build(statics, loads, regions, &by_bronze)
        });
        Index {
            firm: Keying::build(statics, loads, regions, &reference),
            bronze: bronze_keying,
        }
    }

    /// The keying a tier's work is searched in.
    pub fn keying(&self, tier: Tier) -> &Keying {
        match (tier, &self.bronze) {
            (Tier::Bronze, Some(bronze)) => bronze,
            _ => &self.firm,
        }
    }

    /// Every keying, with its name.
    pub fn keyings(&self) -> impl Iterator<Item = (&'static str, &Keying)> {
        std::iter::once(("firm", &self.firm)).chain(self.bronze.iter().map(|keying| ("bronze", keying)))
    }

    fn orders_mut(&mut self) -> impl Iterator<Item = &mut Order> {
        std::iter::once(&mut self.firm)
            .chain(self.bronze.as_mut())
            .flat_map(|keying| [&mut keying.by_model, &mut keying.by_region_model])
    }

    pub fn set_window_class(&mut self, node: usize, from: u8, to: u8) {
        if from != to {
            for order in self.orders_mut() {
                order.set_window_class(node, from, to);
            }
        }
    }

    pub fn move_node(&mut self, node: usize, from: Levels, to: Levels) {
        for order in self.orders_mut() {
            order.set(node, from, false);
            order.set(node, to, true);
        }
    }
}

/// `ask` as thousandths of `of` (positive).
fn share_permille(ask: i64, of: i64) -> u64 {
    (i128::from(ask) * 1000 / i128::from(of)).max(0) as u64
}

/// Splits an order into maximal runs with the same group.
fn ranges(order: &[u32], statics: &[NodeStatic], group: impl Fn(usize) -> usize) -> Vec<RangeInfo> {
    let mut result: Vec<RangeInfo> = Vec::new();
    let mut current_group = usize::MAX;
    for (rank, &node) in order.iter().enumerate() {
        let node = node as usize;
        let statics = &statics[node];
        let this_group = group(node);
        if this_group != current_group || result.is_empty() {
            current_group = this_group;
            result.push(RangeInfo {
                ranks: rank as u32..rank as u32,
                model: statics.model,
                ask_min: [i64::MAX; 3],
                gpu_count_max: 0,
                cu_weight_min: u64::MAX,
                ask_steps: [i64::MAX; ASK_STEPS],
            });
        }
        let range = result.last_mut().expect("pushed above");
        range.ranks.end = rank as u32 + 1;
        for tier in 0..3 {
            if statics.tiers & (1 << tier) != 0 {
                range.ask_min[tier] = range.ask_min[tier].min(ask_floor(statics, tier));
            }
        }
        range.gpu_count_max = range.gpu_count_max.max(statics.gpu_count);
        range.cu_weight_min = range
            .cu_weight_min
            .min(u64::from(statics.cu_milli.max(1)) * u64::from(statics.reliability_weight_ppm.max(1)));
    }
    result
}

/// The lowest ask a node can have for a tier under its price schedule.
fn ask_floor(statics: &NodeStatic, tier: usize) -> i64 {
    if statics.asks[tier] == i64::MAX || statics.tiers & (1 << tier) == 0 {
        i64::MAX
    } else {
        statics.asks[tier] / 1000 * i64::from(statics.ask_floor_permille)
    }
}
