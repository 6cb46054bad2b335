"""Plain nn.Module models: Nadaraya–Watson, Bahdanau seq2seq, Transformer."""
