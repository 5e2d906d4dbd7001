//! The O(n) consistency check: recomputes every counter and index membership from the leases
//! and compares. Tests and the simulator run it after every step; the hot path never does.

use model::{GPU_MILLI_WHOLE, GPUS_PER_NODE_MAX};

use crate::index::{Order, SHARE_BUCKETS, TIER_CLASSES, WHOLE_LEVELS};
use crate::state::Matcher;

impl Matcher {
    pub fn consistency_check(&self) -> Result<(), String> {
        let nodes = self.nodes.len();
        let mut gpu_used = vec![[0u32; GPUS_PER_NODE_MAX]; nodes];
        let mut cpu_used = vec![0u64; nodes];
        let mut memory_used = vec![0u64; nodes];
        let mut listed = vec![0usize; nodes];
        let mut bronze_milli = vec![0u32; nodes];
        let mut other_milli = vec![0u32; nodes];
        let mut total_used = 0u64;
        let mut live = 0usize;
        for (slot, entry) in self.leases.iter().enumerate() {
            if !entry.live {
                continue;
            }
            live += 1;
            let lease = &entry.lease;
            let node = lease.node.index();
            if node >= nodes {
                return Err(format!("lease {} names node {} beyond the fleet", lease.id, lease.node));
            }
            let Some(position) = self.loads[node].leases.iter().position(|entry| *entry == slot as u32) else {
                return Err(format!("lease {} is not listed on node {}", lease.id, lease.node));
            };
            let work = self.loads[node].lease_work.get(position);
            let expected = crate::state::LeaseWork {
                start: lease.start,
                checkpoint_interval_s: entry.checkpoint_interval_s,
                gpu_milli_total: lease.gpu_milli_total(),
            };
            if work != Some(&expected) {
                return Err(format!(
                    "lease {}'s work record on node {} is {work:?}, not {expected:?}",
                    lease.id, lease.node
                ));
            }
            listed[node] += 1;
            for (gpu, used) in gpu_used[node].iter_mut().enumerate() {
                if lease.gpu_mask & (1 << gpu) != 0 {
                    if gpu >= self.statics[node].gpu_count as usize {
                        return Err(format!(
                            "lease {} uses GPU {gpu} that node {} lacks",
                            lease.id, lease.node
                        ));
                    }
                    *used += u32::from(lease.gpu_milli);
                }
            }
            if entry.tier == model::Tier::Bronze {
                bronze_milli[node] += lease.gpu_milli_total();
            } else {
                other_milli[node] += lease.gpu_milli_total();
            }
            cpu_used[node] += u64::from(lease.cpu_milli);
            memory_used[node] += lease.memory_mib;
            total_used += u64::from(lease.gpu_milli_total());
            match self.jobs.get(&lease.job) {
                Some(record) if record.leases.contains(&lease.id) && record.tier == entry.tier => {}
                _ => return Err(format!("lease {} is missing from job {}'s record", lease.id, lease.job)),
            }
        }
        let recorded: usize = self.jobs.values().map(|record| record.leases.len()).sum();
        if recorded != live {
            return Err(format!("job records list {recorded} leases, {live} are live"));
        }
        if total_used != self.gpu_milli_used {
            return Err(format!(
                "GPU milli used is {} but the leases hold {total_used}",
                self.gpu_milli_used
            ));
        }
        for node in 0..nodes {
            let load = &self.loads[node];
            let statics = &self.statics[node];
            if listed[node] != load.leases.len() {
                return Err(format!(
                    "node {node} lists {} leases, {} are live there",
                    load.leases.len(),
                    listed[node]
                ));
            }
            for (gpu, (&held, &counted)) in gpu_used[node].iter().zip(&load.gpu_used_milli).enumerate() {
                if held > u32::from(GPU_MILLI_WHOLE) {
                    return Err(format!("node {node} GPU {gpu} is over-committed: {held} milli"));
                }
                if held != u32::from(counted) {
                    return Err(format!(
                        "node {node} GPU {gpu} counts {counted} milli, leases hold {held}"
                    ));
                }
            }
            if cpu_used[node] != u64::from(load.cpu_used) || cpu_used[node] > u64::from(statics.cpu_milli) {
                return Err(format!(
                    "node {node} CPU counter {} vs leases {} (capacity {})",
                    load.cpu_used, cpu_used[node], statics.cpu_milli
                ));
            }
            if memory_used[node] != load.memory_used || memory_used[node] > statics.memory_mib {
                return Err(format!(
                    "node {node} memory counter {} vs leases {} (capacity {})",
                    load.memory_used, memory_used[node], statics.memory_mib
                ));
            }
            if (bronze_milli[node], other_milli[node]) != (load.bronze_milli, load.other_milli) {
                return Err(format!("node {node} tier counters are off"));
            }
            let expected = if load.offline || load.closed || load.cordoned {
                (0, 0)
            } else {
                load.levels(statics.gpu_count)
            };
            if expected != (load.whole_free, load.share_bucket) {
                return Err(format!(
                    "node {node} levels {:?} should be {expected:?}",
                    (load.whole_free, load.share_bucket)
                ));
            }
        }
        if let Some(minute) = self.clock_minute {
            for node in 0..nodes {
                let statics = &self.statics[node];
                let expected = match self.loads[node].open_until {
                    _ if statics.always_available || !statics.weekly_windows_only => crate::index::WINDOW_CLASSES,
                    None => 0,
                    Some(end) => crate::index::window_class(end.saturating_sub(minute * 60)),
                };
                if self.window_classes[node] != expected {
                    return Err(format!(
                        "node {node} is in open-time class {}, its window says {expected}",
                        self.window_classes[node]
                    ));
                }
            }
        }
        for (keying_name, keying) in self.index.keyings() {
            for (name, order, ranges) in keying.orders() {
                let name = format!("{keying_name} {name}");
                self.check_order(&name, order)?;
                order
                    .check_filters(ranges.into_iter(), &self.statics, &self.window_classes)
                    .map_err(|error| format!("{name}: {error}"))?;
            }
        }
        Ok(())
    }

    fn check_order(&self, name: &str, order: &Order) -> Result<(), String> {
        order.check_firsts().map_err(|error| format!("{name}: {error}"))?;
        let mut whole_counts = [0usize; WHOLE_LEVELS * TIER_CLASSES];
        let mut share_counts = [0usize; SHARE_BUCKETS * TIER_CLASSES];
        for (node, load) in self.loads.iter().enumerate() {
            let rank = order.ranks[node] as usize;
            if order.nodes[rank] as usize != node {
                return Err(format!("{name}: rank {rank} does not map back to node {node}"));
            }
            if load.tier_class != load.current_tier_class() {
                return Err(format!("node {node} is indexed under tier class {}", load.tier_class));
            }
            let class = load.tier_class as usize;
            let whole_slot = load.whole_free as usize * TIER_CLASSES + class;
            let share_slot = load.share_bucket as usize * TIER_CLASSES + class;
            for (slot, set) in order.whole.iter().enumerate().skip(TIER_CLASSES) {
                if set.contains(rank) != (slot == whole_slot) {
                    return Err(format!("{name}: node {node} membership of whole set {slot} is wrong"));
                }
            }
            for (slot, set) in order.share.iter().enumerate().skip(TIER_CLASSES) {
                if set.contains(rank) != (slot == share_slot) {
                    return Err(format!("{name}: node {node} membership of share set {slot} is wrong"));
                }
            }
            whole_counts[whole_slot] += 1;
            share_counts[share_slot] += 1;
        }
        for (slot, &count) in whole_counts.iter().enumerate().skip(TIER_CLASSES) {
            if order.whole[slot].len() != count {
                return Err(format!(
                    "{name}: whole set {slot} holds {} nodes, {count} belong",
                    order.whole[slot].len()
                ));
            }
        }
        for (slot, &count) in share_counts.iter().enumerate().skip(TIER_CLASSES) {
            if order.share[slot].len() != count {
                return Err(format!(
                    "{name}: share set {slot} holds {} nodes, {count} belong",
                    order.share[slot].len()
                ));
            }
        }
        Ok(())
    }
}
