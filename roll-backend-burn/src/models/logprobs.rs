//! Per-token log-probabilities and entropies straight from logits, without materialising a
//! `[batch, seq, vocab]` log-softmax: the last step of scoring and of the policy loss.

use crate::scoring::token_logprobs;
use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor};

/// `log_softmax(logits)[target]` at every position, without materialising the log-softmax.
///
/// Same values as `token_logprobs(log_softmax(logits, 2), targets)` (to float round-off) and
/// the same gradient (`onehot(target) − softmax(logits)` times the upstream gradient) when
/// `logits` carries autodiff; see [`token_logprobs_and_entropy`] for how.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`, `targets`: `[batch, seq]`
/// - output: `[batch, seq]`
pub fn token_logprobs_from_logits(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<2> {
    token_logprobs_and_entropy(logits, targets, false).0
}

/// Per-position `log p(target)` and, if `with_entropy`, the entropy `−Σ p log p` of each
/// next-token distribution, straight from logits.
///
/// The `[batch, seq, vocab]` work is one fused softmax (the backend's row kernel, outside the
/// autodiff graph) plus a few passes; no log-softmax tensor is built. With `m` the row max and
/// `p = softmax(logits)`, `p[argmax] = 1 / Σ exp(x − m)`, so
/// `log p(t) = (x_t − m) + ln max(p)` and `H = −ln max(p) − Σ p (x − m)` (two non-negative
/// terms: no cancellation).
///
/// When `logits` carries autodiff, the normaliser enters the graph as
/// `c + (s − detach(s))`: the constant `c` holds the value and `s = Σ x·k` with a constant
/// `k` contributes exactly the analytic gradient (`k = p` for `logsumexp`,
/// `k = −p (log p + H)` for the entropy); the zero it adds is exact, so values are unchanged.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`, `targets`: `[batch, seq]`
/// - output: two `[batch, seq]`
pub fn token_logprobs_and_entropy(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    with_entropy: bool,
) -> (Tensor<2>, Option<Tensor<2>>) {
    let tracked = logits.is_autodiff();
    let plain = logits.clone().inner();
    let max = plain.clone().max_dim(2);
    let probs = softmax(plain.clone(), 2);
    // ln max(p) = −ln Σ exp(x − m): the log-partition without another exp pass.
    let log_pmax = probs.clone().max_dim(2).log();
    let constant = |t: Tensor<3>| if tracked { t.autodiff() } else { t };
    // Turns a constant `value` `[batch, seq, 1]` into one whose gradient is `Σ_v logits·weight`.
    let with_gradient = |value: Tensor<3>, weight: Tensor<3>| {
        let s = (logits.clone() * constant(weight)).sum_dim(2);
        constant(value) + (s.clone() - s.detach())
    };

    // value: (x_t − m) + ln max(p); gradient: onehot − p.
    let flat = |t: Tensor<3>| constant(t).squeeze_dim::<2>(2);
    let logp = token_logprobs(logits.clone(), targets) - flat(max.clone()) + flat(log_pmax.clone());
    let logp = if tracked {
        logp - with_gradient(Tensor::zeros_like(&log_pmax), probs.clone()).squeeze_dim::<2>(2)
    } else {
        logp
    };
    let entropy = with_entropy.then(|| {
        let centred = plain - max;
        let h = (probs.clone() * centred.clone()).sum_dim(2).neg() - log_pmax.clone();
        if tracked {
            // dH/dx = −p (log p + H), with log p = (x − m) + ln max(p).
            let weight = ((centred + log_pmax) + h.clone()).mul(probs).neg();
            with_gradient(h, weight).squeeze_dim::<2>(2)
        } else {
            h.squeeze_dim::<2>(2)
        }
    });
    (logp, entropy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Device, Distribution, TensorData};

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar()
    }

    /// Reference: the materialised log-softmax, differentiated by autodiff.
    fn reference(logits: Tensor<3>, targets: Tensor<2, Int>) -> (Tensor<2>, Tensor<2>) {
        let logp = log_softmax(logits, 2);
        let entropy = logp.clone().exp().mul(logp.clone()).sum_dim(2).neg();
        (token_logprobs(logp, targets), entropy.squeeze_dim::<2>(2))
    }

    #[test]
    fn values_and_gradients_match_log_softmax() {
        let device = Device::flex().autodiff();
        let shape = [2, 3, 11];
        // Wide logits: a peaked row and a flat one both appear.
        let x = Tensor::<3>::random(shape, Distribution::Normal(0.0, 4.0), &device);
        let targets =
            Tensor::<2, Int>::from_data(TensorData::new(vec![0, 3, 10, 5, 7, 1], [2, 3]), &device);
        let w = Tensor::<2>::random([2, 3], Distribution::Normal(0.0, 1.0), &device);
        let u = Tensor::<2>::random([2, 3], Distribution::Normal(0.0, 1.0), &device);
        let loss = |(logp, h): (Tensor<2>, Tensor<2>)| (logp * w.clone() + h * u.clone()).sum();

        let a = x.clone().detach().require_grad();
        let (want_logp, want_h) = reference(a.clone(), targets.clone());
        let want_grad = a
            .grad(&loss((want_logp.clone(), want_h.clone())).backward())
            .expect("reference gradient");

        let b = x.detach().require_grad();
        let (logp, h) = token_logprobs_and_entropy(b.clone(), targets.clone(), true);
        let h = h.expect("entropy asked for");
        let grad = b
            .grad(&loss((logp.clone(), h.clone())).backward())
            .expect("gradient");

        assert!(max_diff(logp.clone().unsqueeze(), want_logp.unsqueeze()) < 1e-5);
        assert!(max_diff(h.clone().unsqueeze(), want_h.unsqueeze()) < 1e-5);
        assert!(max_diff(grad, want_grad) < 1e-5);

        // Without autodiff: the same values.
        let plain = b.inner();
        let (logp2, h2) = token_logprobs_and_entropy(plain.clone(), targets.inner(), true);
        assert!(max_diff(logp2.unsqueeze(), logp.inner().unsqueeze()) == 0.0);
        assert!(max_diff(h2.expect("entropy").unsqueeze(), h.inner().unsqueeze()) == 0.0);
        let only = token_logprobs_from_logits(plain, Tensor::zeros([2, 3], &Device::flex()));
        assert_eq!(only.dims(), [2, 3]);
    }
}
