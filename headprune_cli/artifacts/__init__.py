"""The versioned JSON artifacts every stage reads and writes (schema), and the compact
encoding of FFN neuron scores inside a scores artifact (neuron_scores)."""
