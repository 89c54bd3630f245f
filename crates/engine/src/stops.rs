//! Stop-string handling on streamed text: release text as soon as it cannot be the start of
//! a stop string, hold back the rest, and cut at the first complete stop string.
//!
//! Every engine behind [`crate::Backend`] needs the same rule, so it lives here once.

/// Incremental stop-string scanner over generated text.
#[derive(Debug)]
pub struct StopScanner {
    stops: Vec<String>,
    pending: String,
}

/// What one [`StopScanner::push`] produced.
#[derive(Debug, PartialEq, Eq)]
pub struct Scanned {
    /// Text that can be shown now.
    pub text: String,
    /// The stop string found, if any; generation must end and nothing after it is shown.
    pub stop: Option<String>,
}

impl StopScanner {
    /// A scanner for these stop strings (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopScanner {
        StopScanner {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Add newly decoded text.
    pub fn push(&mut self, piece: &str) -> Scanned {
        self.pending.push_str(piece);
        // Earlier text was released only once it could not start a stop string, so a match
        // can only begin inside `pending`.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return Scanned {
                text,
                stop: Some(stop),
            };
        }
        let hold = self.held_len();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Scanned { text, stop: None }
    }

    /// Release whatever is still held back (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_len(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(p.len());
            for len in (best + 1..=max).rev() {
                let start = p.len() - len;
                if p.is_char_boundary(start) && stop.starts_with(&p[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn releases_text_that_cannot_start_a_stop() {
        let mut s = StopScanner::new(&stops(&["END"]));
        assert_eq!(s.push("hello ").text, "hello ");
        assert_eq!(s.push("wor").text, "wor");
        assert_eq!(s.push("ld E").text, "ld ");
        assert_eq!(s.push("N").text, "");
        let last = s.push("Dafter");
        assert_eq!(last.text, "");
        assert_eq!(last.stop.as_deref(), Some("END"));
    }

    #[test]
    fn false_start_is_released() {
        let mut s = StopScanner::new(&stops(&["END"]));
        assert_eq!(s.push("EN").text, "");
        assert_eq!(s.push("X").text, "ENX");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn earliest_stop_wins_and_text_before_it_is_kept() {
        let mut s = StopScanner::new(&stops(&["cd", "b"]));
        let r = s.push("abcd");
        assert_eq!(r.text, "a");
        assert_eq!(r.stop.as_deref(), Some("b"));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let mut s = StopScanner::new(&stops(&["éx"]));
        assert_eq!(s.push("aé").text, "a");
        assert_eq!(s.finish(), "é");
    }

    #[test]
    fn no_stops_releases_everything() {
        let mut s = StopScanner::new(&stops(&["", ""]));
        assert_eq!(s.push("abc").text, "abc");
        assert_eq!(s.push("").stop, None);
    }
}
