//! Expert routing of mixture-of-experts layers (mixtral, qwen3moe), as host data every
//! backend fills the same way: the rule that picks a token's experts, and the grouping of a
//! pass's (token, slot) pairs by expert that the expert products run over.
//!
//! Routing follows llama.cpp and Hugging Face: softmax over all experts' router logits (in
//! f64), the `k` largest probabilities (ties to the lower expert id), optionally
//! renormalised to sum 1. This module never multiplies a weight.

/// The experts and weights of up to `max_rows` tokens, and their grouping by expert;
/// allocated once, refilled every pass.
#[derive(Debug)]
pub struct Routing {
    n_expert: usize,
    k: usize,
    rows: usize,
    selected: Vec<usize>,
    weight: Vec<f32>,
    order: Vec<usize>,
    start: Vec<usize>,
    fill: Vec<usize>,
    probs: Vec<f64>,
}

impl Routing {
    /// Room for `max_rows` tokens choosing `k_max` of `n_expert` experts each.
    pub fn new(n_expert: usize, k_max: usize, max_rows: usize) -> Routing {
        let slots = max_rows * k_max;
        Routing {
            n_expert,
            k: k_max,
            rows: 0,
            selected: vec![0; slots],
            weight: vec![0.0; slots],
            order: vec![0; slots],
            start: vec![0; n_expert + 1],
            fill: vec![0; n_expert + 1],
            probs: vec![0.0; n_expert],
        }
    }

    /// Starts a pass of `rows` tokens choosing `k` experts each; `false` (and nothing
    /// changes) when that does not fit the room made by [`Routing::new`].
    pub fn begin(&mut self, rows: usize, k: usize) -> bool {
        if k == 0
            || k > self.n_expert
            || rows.checked_mul(k).is_none_or(|s| s > self.selected.len())
        {
            return false;
        }
        (self.rows, self.k) = (rows, k);
        true
    }

    /// Experts in the layer.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Experts each token of the pass chooses.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Tokens of the pass.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Routes token `t` of the pass by its router logits (`n_expert` values): its experts in
    /// descending probability (ties to the lower id) and their weights.
    pub fn route(&mut self, t: usize, logits: &[f32], norm_topk: bool) {
        let k = self.k;
        let (selected, weight) = (
            &mut self.selected[t * k..(t + 1) * k],
            &mut self.weight[t * k..(t + 1) * k],
        );
        let probs = &mut self.probs;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        for (p, &l) in probs.iter_mut().zip(logits) {
            *p = f64::from(l - max).exp();
            sum += *p;
        }
        for p in probs.iter_mut() {
            *p /= sum;
        }
        let mut picked_sum = 0.0f64;
        for slot in 0..k {
            let mut best = usize::MAX;
            for (e, &p) in probs.iter().enumerate() {
                if selected[..slot].contains(&e) {
                    continue;
                }
                if best == usize::MAX || p > probs[best] {
                    best = e;
                }
            }
            selected[slot] = best;
            picked_sum += probs[best];
        }
        let scale = if norm_topk { 1.0 / picked_sum } else { 1.0 };
        for slot in 0..k {
            weight[slot] = (probs[selected[slot]] * scale) as f32;
        }
    }

    /// Groups the pass's (token, slot) pairs by expert (a counting sort, so each expert's
    /// pairs stay in token order), after every token was routed.
    pub fn group(&mut self) {
        let pairs = self.rows * self.k;
        self.start.fill(0);
        for &e in &self.selected[..pairs] {
            self.start[e + 1] += 1;
        }
        for e in 0..self.n_expert {
            self.start[e + 1] += self.start[e];
        }
        self.fill.copy_from_slice(&self.start);
        for (i, &e) in self.selected[..pairs].iter().enumerate() {
            self.order[self.fill[e]] = i;
            self.fill[e] += 1;
        }
    }

    /// The (token, slot) pairs (`token * k + slot`) routed to expert `e`, in token order.
    pub fn pairs(&self, e: usize) -> &[usize] {
        &self.order[self.start[e]..self.start[e + 1]]
    }

    /// The experts of each (token, slot) pair.
    pub fn selected(&self) -> &[usize] {
        &self.selected[..self.rows * self.k]
    }

    /// The routing weight of each (token, slot) pair.
    pub fn weights(&self) -> &[f32] {
        &self.weight[..self.rows * self.k]
    }

    /// `(experts that run, rows they take)` in this pass: the path marker of a top-k layer.
    pub fn runs(&self) -> (usize, usize) {
        (0..self.n_expert).fold((0, 0), |(n, rows), e| {
            let m = self.pairs(e).len();
            (n + usize::from(m > 0), rows + m)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_top_k_by_probability_and_renormalises() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 2.0];
        let mut r = Routing::new(5, 3, 1);
        assert!(r.begin(1, 2));
        r.route(0, &logits, true);
        // Experts 1 and 4 tie at the top: lower id first.
        assert_eq!(r.selected(), [1, 4]);
        assert!(r.weights().iter().all(|w| (w - 0.5).abs() < 1e-7));
        r.route(0, &logits, false);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let p1 = (2.0f64.exp() / z) as f32;
        assert!(
            (r.weights()[0] - p1).abs() < 1e-6,
            "{} vs {p1}",
            r.weights()[0]
        );
        assert!(r.begin(1, 3));
        r.route(0, &logits, true);
        assert_eq!(r.selected(), [1, 4, 3]);
        r.group();
        assert_eq!((r.pairs(4), r.runs()), (&[1][..], (3, 3)));
        assert!(!r.begin(2, 3) && !r.begin(1, 0) && !r.begin(1, 6));
    }
}
