//! The top-p and min-p cut over candidates sorted best first: how many to keep, or that the
//! sorted prefix at hand is too short to tell. Shared by the full-row sampler, which sorts
//! only the best few hundred candidates of a row before it knows it needs more, and by the
//! device candidates path, which never has more than those.
//!
//! It only counts; it never reorders, draws or touches the random stream, so a caller that
//! gets `None` can fetch more of the row and start again with nothing to undo.

/// The untempered mass of `sorted` (best first) relative to its first logit:
/// Σ exp(l − max), summed best first. What a top-p cut with top-k is relative to.
pub(super) fn mass(sorted: &[(u32, f32)]) -> f64 {
    let max = sorted.first().map_or(0.0, |x| f64::from(x.1));
    sorted.iter().map(|x| (f64::from(x.1) - max).exp()).sum()
}

/// How many of `sorted` (best first; its first logit is the row's largest) the top-p and
/// min-p filters keep. `total` is the untempered mass of the candidate set the cut is
/// defined over (Σ exp(l − max)); `complete` says whether `sorted` holds all of that set.
/// `None` when it does not and the cut could reach past its end. `sorted` is not empty.
pub(super) fn keep(
    sorted: &[(u32, f32)],
    top_p: f32,
    min_p: f32,
    total: f64,
    complete: bool,
) -> Option<usize> {
    let max = f64::from(sorted[0].1);
    let weight = |l: f32| (f64::from(l) - max).exp();
    let mut keep = sorted.len();
    if top_p < 1.0 {
        let mut acc = 0.0;
        match sorted.iter().position(|x| {
            acc += weight(x.1) / total;
            acc >= f64::from(top_p)
        }) {
            Some(i) => keep = i + 1,
            None if !complete => return None,
            None => {}
        }
    }
    if min_p > 0.0 {
        let n = sorted[..keep]
            .iter()
            .take_while(|x| weight(x.1) >= f64::from(min_p))
            .count();
        if n == sorted.len() && !complete {
            return None;
        }
        keep = n.max(1);
    }
    Some(keep)
}

#[cfg(test)]
mod tests {
    use super::keep;

    fn row(logits: &[f32]) -> Vec<(u32, f32)> {
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect()
    }

    fn mass(logits: &[f32]) -> f64 {
        logits
            .iter()
            .map(|&l| (f64::from(l) - f64::from(logits[0])).exp())
            .sum()
    }

    #[test]
    fn top_p_stops_at_the_first_candidate_reaching_the_mass() {
        let l = [2.0, 1.0, 0.0, -1.0, -2.0];
        let full = row(&l);
        let t = mass(&l);
        // p(0) ≈ 0.64, p(0..2) ≈ 0.87, p(0..3) ≈ 0.95.
        assert_eq!(keep(&full, 0.5, 0.0, t, true), Some(1));
        assert_eq!(keep(&full, 0.9, 0.0, t, true), Some(3));
        assert_eq!(keep(&full, 0.9, 0.0, t, false), Some(3));
        assert_eq!(keep(&full[..2], 0.9, 0.0, t, false), None);
        assert_eq!(keep(&full[..2], 0.9, 0.0, t, true), Some(2));
        assert_eq!(keep(&full, 1.0, 0.0, t, false), Some(5));
    }

    #[test]
    fn min_p_needs_a_failing_candidate_unless_the_set_is_complete() {
        let l = [0.0, -0.5, -1.0, -3.0];
        let full = row(&l);
        let t = mass(&l);
        // exp(-1) ≈ 0.37 passes min_p 0.3, exp(-3) ≈ 0.05 does not.
        assert_eq!(keep(&full, 1.0, 0.3, t, false), Some(3));
        assert_eq!(keep(&full[..3], 1.0, 0.3, t, false), None);
        assert_eq!(keep(&full[..3], 1.0, 0.3, t, true), Some(3));
        // At least one candidate always stays.
        assert_eq!(keep(&full, 1.0, 1.0, t, true), Some(1));
        // A top-p cut inside the prefix (p ≈ 0.49, 0.79) decides min-p too.
        assert_eq!(keep(&full[..3], 0.5, 0.3, t, false), Some(2));
    }
}
