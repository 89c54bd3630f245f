//! `ferrite bench --compare OLD NEW`: match two receipts' rows by (frontier, batch) and judge
//! each clock's change.
//!
//! Only receipts of the same model file (sha256) and backend are comparable: a different
//! file or backend changes what is measured, so the command refuses instead of printing
//! ratios that look meaningful.

use super::receipt::{Receipt, col};

/// Slowdown above which a metric is marked `investigate`.
pub const INVESTIGATE: f64 = 0.05;
/// Slowdown above which a metric is marked `regression`.
pub const REGRESSION: f64 = 0.10;

/// Verdict of one metric.
/// Ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Within 5 % or faster.
    Ok,
    /// 5–10 % slower.
    Investigate,
    /// More than 10 % slower.
    Regression,
}

impl Verdict {
    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Investigate => "investigate",
            Verdict::Regression => "regression",
        }
    }
}

/// The metrics compared: column and whether larger is better.
const METRICS: [(&str, bool); 3] = [
    ("ttft_ms_median", false),
    ("prefill_tps_median", true),
    ("decode_tps_median", true),
];

/// How much slower `new` is than `old` (positive = slower), for a higher- or lower-is-better
/// metric; `None` when `old` is not a positive finite number.
pub fn slowdown(old: f64, new: f64, higher_is_better: bool) -> Option<f64> {
    if !(old.is_finite() && old > 0.0 && new.is_finite()) {
        return None;
    }
    Some(if higher_is_better {
        1.0 - new / old
    } else {
        new / old - 1.0
    })
}

/// The verdict of a slowdown (positive = slower).
pub fn verdict(slow: f64) -> Verdict {
    if slow > REGRESSION {
        Verdict::Regression
    } else if slow > INVESTIGATE {
        Verdict::Investigate
    } else {
        Verdict::Ok
    }
}

/// Refuses receipts that measure different things; returns the refusal message.
pub fn check_comparable(old: &Receipt, new: &Receipt) -> Result<(), String> {
    for key in ["model_sha256", "backend"] {
        let (a, b) = (old.get(key), new.get(key));
        match (a, b) {
            (Some(a), Some(b)) if a == b => {}
            _ => {
                return Err(format!(
                    "refusing to compare: {key} differs (old {}, new {}); receipts of different \
                     models or backends measure different things",
                    a.unwrap_or("missing"),
                    b.unwrap_or("missing")
                ));
            }
        }
    }
    Ok(())
}

/// Compares and prints a table to stdout; returns the worst verdict, or an error message
/// when nothing is comparable.
pub fn compare(old: &Receipt, new: &Receipt) -> Result<Verdict, String> {
    check_comparable(old, new)?;
    for key in ["cpu_model", "threads", "simd", "git_commit"] {
        if old.get(key) != new.get(key) {
            println!(
                "note: {key}: {} -> {}",
                old.get(key).unwrap_or("missing"),
                new.get(key).unwrap_or("missing")
            );
        }
    }
    let (f, b) = (col("frontier"), col("batch"));
    println!(
        "{:>8} {:>5}  {:<18} {:>12} {:>12} {:>7}  verdict",
        "frontier", "batch", "metric", "old", "new", "ratio"
    );
    let mut worst = Verdict::Ok;
    let mut matched = 0;
    for o in &old.rows {
        let Some(n) = new.rows.iter().find(|n| n[f] == o[f] && n[b] == o[b]) else {
            println!("{:>8} {:>5}  only in OLD", o[f], o[b]);
            continue;
        };
        matched += 1;
        for (name, higher) in METRICS {
            let c = col(name);
            let (ov, nv) = (o[c], n[c]);
            let (ratio, v) = match slowdown(ov, nv, higher) {
                Some(s) => (nv / ov, verdict(s)),
                None => (f64::NAN, Verdict::Investigate),
            };
            worst = worst.max(v);
            println!(
                "{:>8} {:>5}  {:<18} {:>12.3} {:>12.3} {:>7.3}  {}",
                o[f],
                o[b],
                name,
                ov,
                nv,
                ratio,
                v.name()
            );
        }
    }
    for n in &new.rows {
        if !old.rows.iter().any(|o| n[f] == o[f] && n[b] == o[b]) {
            println!("{:>8} {:>5}  only in NEW", n[f], n[b]);
        }
    }
    if matched == 0 {
        return Err("refusing to compare: the receipts have no (frontier, batch) in common".into());
    }
    println!("overall: {}", worst.name());
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::receipt::COLUMNS;

    fn receipt(sha: &str, decode: f64) -> Receipt {
        let mut row = vec![1.0; COLUMNS.len()];
        row[col("frontier")] = 64.0;
        row[col("decode_tps_median")] = decode;
        Receipt {
            header: vec![
                ("model_sha256".into(), sha.into()),
                ("backend".into(), "cpu".into()),
            ],
            rows: vec![row],
        }
    }

    #[test]
    fn thresholds_split_ok_investigate_regression() {
        let base = receipt("a", 100.0);
        assert_eq!(compare(&base, &receipt("a", 100.0)), Ok(Verdict::Ok));
        assert_eq!(compare(&base, &receipt("a", 96.0)), Ok(Verdict::Ok));
        assert_eq!(
            compare(&base, &receipt("a", 93.0)),
            Ok(Verdict::Investigate)
        );
        assert_eq!(compare(&base, &receipt("a", 85.0)), Ok(Verdict::Regression));
        assert_eq!(compare(&base, &receipt("a", 150.0)), Ok(Verdict::Ok));
    }

    #[test]
    fn ttft_is_lower_is_better() {
        assert_eq!(slowdown(100.0, 120.0, false), Some(0.19999999999999996));
        assert!(slowdown(0.0, 1.0, true).is_none());
    }

    #[test]
    fn refuses_other_model_or_backend() {
        assert!(compare(&receipt("a", 1.0), &receipt("b", 1.0)).is_err());
        let mut other = receipt("a", 1.0);
        other.header[1].1 = "cuda".into();
        assert!(compare(&receipt("a", 1.0), &other).is_err());
    }
}
