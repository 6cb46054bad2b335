"""Data flow: corpora → download → tokenizer → batching → datamodule."""
