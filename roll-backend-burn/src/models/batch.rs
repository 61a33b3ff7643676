//! The input of every model: a padded batch of token sequences with its attention mask and
//! per-sequence position ids, built so that padding never changes a real token's result.

use crate::{BackendError, Result};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

/// Which side of a batch row holds the padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingSide {
    /// Padding before the tokens (what generation uses: every row ends at the last column).
    #[default]
    Left,
    /// Padding after the tokens.
    Right,
}

/// A padded batch of token sequences, ready for a model's `forward`.
///
/// Padding never changes a real token's result: padded keys are masked out of attention and
/// position ids count only real tokens, so each row is computed exactly as if it were alone.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// Token ids, padding filled with `pad_id`. `[batch, seq]`.
    pub input_ids: Tensor<2, Int>,
    /// `true` where a real token is. `[batch, seq]`.
    pub attention_mask: Tensor<2, Bool>,
    /// Position of each token within its own sequence (0 for padding). `[batch, seq]`.
    pub position_ids: Tensor<2, Int>,
    /// Length of each sequence (real tokens).
    pub lengths: Vec<usize>,
    /// Where the padding is.
    pub padding: PaddingSide,
}

impl TokenBatch {
    /// Pads `sequences` to a common length on `padding`'s side.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if there are no sequences or one is empty,
    /// [`BackendError::TokenOutOfVocab`] if an id is `>= vocab_size`.
    pub fn new<S: AsRef<[u32]>>(
        sequences: &[S],
        padding: PaddingSide,
        pad_id: u32,
        vocab_size: usize,
        device: &Device,
    ) -> Result<Self> {
        if sequences.is_empty() {
            return Err(BackendError::InvalidInput("no sequences to batch".into()));
        }
        let lengths: Vec<usize> = sequences.iter().map(|s| s.as_ref().len()).collect();
        if lengths.contains(&0) {
            return Err(BackendError::InvalidInput("empty token sequence".into()));
        }
        let width = lengths.iter().copied().max().unwrap_or(0);
        let batch = sequences.len();
        let mut ids = vec![i32::try_from(pad_id).unwrap_or(0); batch * width];
        let mut mask = vec![false; batch * width];
        let mut pos = vec![0i32; batch * width];
        for (row, seq) in sequences.iter().enumerate() {
            let seq = seq.as_ref();
            let offset = match padding {
                PaddingSide::Left => width - seq.len(),
                PaddingSide::Right => 0,
            };
            for (t, &id) in seq.iter().enumerate() {
                let id = check_id(id, vocab_size)?;
                let at = row * width + offset + t;
                ids[at] = id;
                mask[at] = true;
                pos[at] = i32::try_from(t).map_err(|_| {
                    BackendError::InvalidInput(format!("sequence of {} tokens", seq.len()))
                })?;
            }
        }
        Ok(Self {
            input_ids: Tensor::from_data(TensorData::new(ids, [batch, width]), device),
            attention_mask: Tensor::from_data(TensorData::new(mask, [batch, width]), device),
            position_ids: Tensor::from_data(TensorData::new(pos, [batch, width]), device),
            lengths,
            padding,
        })
    }

    /// One unpadded sequence.
    ///
    /// # Errors
    /// As [`TokenBatch::new`].
    pub fn single(ids: &[u32], vocab_size: usize, device: &Device) -> Result<Self> {
        Self::new(&[ids], PaddingSide::Right, 0, vocab_size, device)
    }

    /// Column of token `t` of row `row` in the padded layout.
    pub fn column(&self, row: usize, t: usize) -> usize {
        let width = self.lengths.iter().copied().max().unwrap_or(0);
        match self.padding {
            PaddingSide::Left => width - self.lengths[row] + t,
            PaddingSide::Right => t,
        }
    }
}

/// Checks a token id against the vocabulary and converts it for an Int tensor.
pub(crate) fn check_id(id: u32, vocab_size: usize) -> Result<i32> {
    if (id as usize) < vocab_size
        && let Ok(v) = i32::try_from(id)
    {
        return Ok(v);
    }
    Err(BackendError::TokenOutOfVocab { id, vocab_size })
}
