//! Hand-scheduled CPU decoding for dense Qwen models over a paged key/value cache.
