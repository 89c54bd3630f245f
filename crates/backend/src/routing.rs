//! Expert routing of mixture-of-experts layers (mixtral, qwen3moe), as host data every
//! backend fills the same way: the rule that picks a token's experts, and the grouping of a
//! pass's (token, slot) pairs by expert that the expert products run over.
//!
//! Routing follows llama.cpp and Hugging Face ([`RouteRule`]): scores by softmax over all
//! experts' router logits or by a sigmoid of each (in f64); optionally a selection bias
//! added to the scores and a limit to the best groups of experts, both only to choose; the
//! `k` best choices (ties to the lower expert id); their unbiased scores as weights,
//! optionally renormalised to sum 1, times a scale. This module never multiplies a weight.

/// How router logits become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (Mixtral, Qwen3-MoE, DeepSeek V2).
    Softmax,
    /// A sigmoid of each logit (DeepSeek V3, GLM-4.5: llama.cpp's gating function 2).
    Sigmoid,
}

/// The rule that picks a token's experts from its router logits and weighs them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteRule {
    /// Scores from logits.
    pub gating: Gating,
    /// Renormalise the chosen experts' weights to sum 1.
    pub norm_topk: bool,
    /// Multiplier of the final weights (DeepSeek's `routed_scaling_factor`).
    pub scale: f32,
    /// `(groups, kept)`: the experts split into `groups` equal groups in id order, each
    /// scored by the sum of its two best choices; a token chooses only from the `kept`
    /// best groups (DeepSeek V3's `n_group`, `topk_group`). `None`: one group.
    pub groups: Option<(usize, usize)>,
}

impl RouteRule {
    /// Softmax, top k, renormalised when `norm_topk`; weights unscaled, no groups.
    pub fn softmax(norm_topk: bool) -> RouteRule {
        RouteRule {
            gating: Gating::Softmax,
            norm_topk,
            scale: 1.0,
            groups: None,
        }
    }

    /// Why the rule cannot route `k` of `n_expert` experts, if it cannot.
    pub fn check(&self, n_expert: usize, k: usize) -> Result<(), String> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(format!(
                "weight scale {} is not finite and positive",
                self.scale
            ));
        }
        if let Some((groups, kept)) = self.groups {
            if groups == 0 || !n_expert.is_multiple_of(groups) {
                return Err(format!(
                    "{groups} groups do not split {n_expert} experts evenly"
                ));
            }
            if kept == 0 || kept > groups {
                return Err(format!("{kept} kept groups of {groups}"));
            }
            if k > kept * (n_expert / groups) {
                return Err(format!("{k} experts do not fit in {kept} groups"));
            }
        }
        Ok(())
    }
}

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
    choice: Vec<f64>,
    allowed: Vec<bool>,
    group_score: Vec<f64>,
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
            choice: vec![0.0; n_expert],
            allowed: vec![true; n_expert],
            group_score: vec![0.0; n_expert],
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

    /// Routes token `t` of the pass by its router logits (`n_expert` values) under `rule`,
    /// with `bias` (one per expert) added to the scores to choose: its experts in
    /// descending choice (ties to the lower id) and their weights. Callers check the rule
    /// first ([`RouteRule::check`]; the backends' `moe_route` refuses one that fails); an
    /// unchecked one that fails routes without its groups rather than panicking.
    pub fn route(&mut self, t: usize, logits: &[f32], rule: &RouteRule, bias: Option<&[f32]>) {
        let k = self.k;
        let n = self.n_expert;
        let (selected, weight) = (
            &mut self.selected[t * k..(t + 1) * k],
            &mut self.weight[t * k..(t + 1) * k],
        );
        let probs = &mut self.probs;
        match rule.gating {
            Gating::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f64;
                for (p, &l) in probs.iter_mut().zip(logits) {
                    *p = f64::from(l - max).exp();
                    sum += *p;
                }
                for p in probs.iter_mut() {
                    *p /= sum;
                }
            }
            Gating::Sigmoid => {
                for (p, &l) in probs.iter_mut().zip(logits) {
                    *p = 1.0 / (1.0 + (-f64::from(l)).exp());
                }
            }
        }
        let choice = &mut self.choice;
        for (e, (c, &p)) in choice.iter_mut().zip(probs.iter()).enumerate() {
            *c = p + bias.and_then(|b| b.get(e)).map_or(0.0, |&b| f64::from(b));
        }
        let allowed = &mut self.allowed;
        allowed.fill(true);
        if let Some((groups, kept)) = rule.groups.filter(|_| rule.check(n, k).is_ok())
            && groups > 1
        {
            let size = n / groups;
            for (g, score) in self.group_score[..groups].iter_mut().enumerate() {
                let group = &choice[g * size..(g + 1) * size];
                let (mut first, mut second) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
                for &c in group {
                    if c > first {
                        (first, second) = (c, first);
                    } else if c > second {
                        second = c;
                    }
                }
                *score = if size > 1 { first + second } else { first };
            }
            allowed.fill(false);
            for _ in 0..kept {
                let scores = &self.group_score[..groups];
                let best = (0..groups).filter(|&g| !allowed[g * size]).fold(
                    None,
                    |b: Option<usize>, g| match b {
                        Some(b) if scores[b] >= scores[g] => Some(b),
                        _ => Some(g),
                    },
                );
                if let Some(g) = best {
                    allowed[g * size..(g + 1) * size].fill(true);
                }
            }
        }
        let mut picked_sum = 0.0f64;
        for slot in 0..k {
            let mut best = usize::MAX;
            for (e, &c) in choice.iter().enumerate() {
                if !allowed[e] || selected[..slot].contains(&e) {
                    continue;
                }
                if best == usize::MAX || c > choice[best] {
                    best = e;
                }
            }
            // `k <= n_expert` (`begin`) and a checked rule leaves at least `k` allowed.
            let best = if best == usize::MAX { slot } else { best };
            selected[slot] = best;
            picked_sum += probs[best];
        }
        let norm = if rule.norm_topk {
            1.0 / picked_sum
        } else {
            1.0
        };
        let scale = norm * f64::from(rule.scale);
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
        r.route(0, &logits, &RouteRule::softmax(true), None);
        // Experts 1 and 4 tie at the top: lower id first.
        assert_eq!(r.selected(), [1, 4]);
        assert!(r.weights().iter().all(|w| (w - 0.5).abs() < 1e-7));
        r.route(0, &logits, &RouteRule::softmax(false), None);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let p1 = (2.0f64.exp() / z) as f32;
        assert!(
            (r.weights()[0] - p1).abs() < 1e-6,
            "{} vs {p1}",
            r.weights()[0]
        );
        assert!(r.begin(1, 3));
        r.route(0, &logits, &RouteRule::softmax(true), None);
        assert_eq!(r.selected(), [1, 4, 3]);
        r.group();
        assert_eq!((r.pairs(4), r.runs()), (&[1][..], (3, 3)));
        assert!(!r.begin(2, 3) && !r.begin(1, 0) && !r.begin(1, 6));
    }

    /// DeepSeek V3's rule by hand: group A holds the single best expert but the weaker
    /// pair, so keeping one group drops it; the bias moves expert 4 below expert 7 for the
    /// choice while the weights stay the unbiased sigmoids, renormalised and scaled.
    #[test]
    fn sigmoid_routing_keeps_the_best_groups_and_chooses_by_biased_score() {
        let logits = [3.0f32, -2.0, -2.0, -2.0, 1.0, 1.5, -0.5, 0.2];
        let mut bias = [0.0f32; 8];
        bias[4] = -0.5;
        let rule = RouteRule {
            gating: Gating::Sigmoid,
            norm_topk: true,
            scale: 2.5,
            groups: Some((2, 1)),
        };
        assert_eq!(rule.check(8, 2), Ok(()));
        let mut r = Routing::new(8, 2, 1);
        assert!(r.begin(1, 2));
        r.route(0, &logits, &rule, Some(&bias));
        assert_eq!(r.selected(), [5, 7]);
        let s = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (a, b) = (s(1.5), s(0.2));
        for (w, want) in r.weights().iter().zip([a, b]) {
            assert!((f64::from(*w) - 2.5 * want / (a + b)).abs() < 1e-6, "{w}");
        }
        // Each part of the rule matters: without groups expert 0 wins, without the bias 4.
        r.route(
            0,
            &logits,
            &RouteRule {
                groups: None,
                ..rule
            },
            Some(&bias),
        );
        assert_eq!(r.selected(), [0, 5]);
        r.route(0, &logits, &rule, None);
        assert_eq!(r.selected(), [5, 4]);
        for bad in [Some((3, 1)), Some((2, 0)), Some((2, 3)), Some((4, 1))] {
            assert!(
                RouteRule {
                    groups: bad,
                    ..rule
                }
                .check(8, 3)
                .is_err(),
                "{bad:?}"
            );
        }
        assert!(RouteRule { scale: 0.0, ..rule }.check(8, 2).is_err());
    }
}
