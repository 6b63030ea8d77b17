//! Property tests of the `:authority` rewriter over outside bytes: whatever a client sends,
//! in whatever pieces, the rewriter never panics, never holds more than one frame, passes a
//! stream that is not HTTP/2 through unchanged, and stops at the first malformed frame with
//! an error instead of guessing.

use bytes::BytesMut;
use proptest::prelude::*;

use super::*;

/// Feeds `stream` cut at `cuts` (positions, any order) through one rewriter; returns the
/// output and the first error.
fn run(stream: &[u8], cuts: &[usize]) -> (Vec<u8>, Option<AuthorityRewriteError>, usize) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    cuts.push(stream.len());
    cuts.sort_unstable();
    let mut rewriter = ClientStreamRewriter::new();
    let (mut input, mut output) = (BytesMut::new(), BytesMut::new());
    let mut start = 0;
    let mut most_buffered = 0;
    for end in cuts {
        input.extend_from_slice(&stream[start..end]);
        start = end;
        if let Err(err) = rewriter.process(&mut input, &mut output) {
            return (output.to_vec(), Some(err), most_buffered);
        }
        most_buffered = most_buffered.max(input.len());
    }
    (output.to_vec(), None, most_buffered)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_stream_without_the_preface_passes_through_unchanged(
        stream in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        prop_assume!(!stream.is_empty() && !PREFACE.starts_with(&stream[..stream.len().min(PREFACE.len())]));
        let (output, error, _) = run(&stream, &cuts);
        prop_assert!(error.is_none());
        prop_assert_eq!(output, stream);
    }

    #[test]
    fn arbitrary_frames_after_the_preface_never_panic_and_buffer_at_most_one_frame(
        frames in proptest::collection::vec(
            (any::<u8>(), any::<u8>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..600)),
            0..12,
        ),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let mut stream = PREFACE.to_vec();
        for (kind, flags, stream_id, payload) in &frames {
            let len = u32::try_from(payload.len()).unwrap();
            stream.extend_from_slice(&len.to_be_bytes()[1..]);
            stream.extend_from_slice(&[*kind % 12, *flags]);
            stream.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
            stream.extend_from_slice(payload);
        }
        let (output, error, most_buffered) = run(&stream, &cuts);
        // Held back after each call: at most the one incomplete frame.
        let largest = frames.iter().map(|f| f.3.len() + 9).max().unwrap_or(0).max(9);
        prop_assert!(most_buffered <= largest, "buffered {most_buffered}, largest frame {largest}");
        if let Some(err) = error {
            prop_assert!(!err.to_string().is_empty());
        } else {
            prop_assert!(output.starts_with(PREFACE));
        }
    }
}
