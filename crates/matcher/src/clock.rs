//! Moving the clock for a caller that knows which nodes' windows or price rules change: a
//! simulator that computed every boundary in advance looks at those nodes only, instead of
//! every windowed and priced node each minute.

use model::Timestamp;

use crate::state::Matcher;

impl Matcher {
    /// Like [`Matcher::advance_clock`], but looks only at `changed`: the nodes with a window or
    /// price-rule boundary since the last minute the matcher saw (each listed node is brought
    /// up to `now`, even if the clock is already at `now`'s minute). Every other node's cached
    /// availability and price multiplier must still hold, which is true when all their windows
    /// are weekly and no boundary of theirs passed. Call [`Matcher::advance_clock`] once first,
    /// and whenever in doubt.
    pub fn advance_clock_for(&mut self, now: Timestamp, changed: &[u32]) {
        let minute = now.div_euclid(60);
        let backwards = self.clock_minute.is_some_and(|previous| previous > minute);
        self.clock_minute = Some(minute);
        let minute_start = minute * 60;
        if backwards {
            // Open time grows when the clock goes back: no drop is scheduled for that.
            for position in 0..self.windowed.len() {
                let node = self.windowed[position] as usize;
                self.refresh_window_class(node, minute_start);
            }
        }
        for &node in changed {
            let node = node as usize;
            if node >= self.nodes.len() {
                continue;
            }
            if self.statics[node].has_price_rules {
                self.loads[node].price_multiplier_permille =
                    self.nodes[node].policy.multiplier_at(minute_start).unwrap_or(0);
            }
            if self.statics[node].always_available {
                continue;
            }
            self.reopen(node, minute_start, now);
        }
        self.lower_window_classes(minute_start);
    }
}
