//! Pearson's chi-square test of homogeneity for the distribution tests: do two samples of
//! counts over the same cells come from one distribution?
//!
//! The p-value is the regularized upper incomplete gamma function Q(df/2, x/2), by its
//! series below a + 1 and its continued fraction above (Numerical Recipes' `gammq`).

/// `(statistic, degrees of freedom, p)` for counts `a` and `b` over the same cells; cells
/// empty in both are left out.
pub(crate) fn homogeneity(a: &[u64], b: &[u64]) -> (f64, usize, f64) {
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    let n = na + nb;
    let mut stat = 0.0;
    let mut cells = 0usize;
    for (&x, &y) in a.iter().zip(b) {
        let col = (x + y) as f64;
        if col == 0.0 {
            continue;
        }
        cells += 1;
        for (o, total) in [(x as f64, na), (y as f64, nb)] {
            let e = total * col / n;
            stat += (o - e) * (o - e) / e;
        }
    }
    let df = cells.saturating_sub(1).max(1);
    (stat, df, upper_gamma_q(df as f64 / 2.0, stat / 2.0))
}

/// Q(a, x) = Γ(a, x) / Γ(a).
fn upper_gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        // P(a, x) by its series.
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..1000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        1.0 - sum * front
    } else {
        // Q(a, x) by the modified Lentz continued fraction.
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-15 {
                break;
            }
        }
        front * h
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, nine coefficients).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = C[0]
        + C[1..]
            .iter()
            .enumerate()
            .map(|(i, c)| c / (x + i as f64 + 1.0))
            .sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_values_match_the_chi_square_table() {
        // Oracle: the standard chi-square table (critical values at p = 0.05 and 0.01).
        for (x, df, p) in [
            (3.841, 1.0, 0.05),
            (6.635, 1.0, 0.01),
            (11.070, 5.0, 0.05),
            (18.307, 10.0, 0.05),
            (82.529, 63.0, 0.05),
        ] {
            let q = upper_gamma_q(df / 2.0, x / 2.0);
            assert!((q - p).abs() < 2e-4, "x {x} df {df}: {q} vs {p}");
        }
        // ln Γ of integers is ln of a factorial.
        assert!((ln_gamma(6.0) - 120f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn equal_counts_pass_and_shifted_counts_fail() {
        let (_, df, p) = homogeneity(&[500, 300, 200, 0], &[498, 305, 197, 0]);
        assert_eq!(df, 2);
        assert!(p > 0.9, "{p}");
        let (_, _, p) = homogeneity(&[500, 300, 200], &[400, 350, 250]);
        assert!(p < 1e-4, "{p}");
    }
}
