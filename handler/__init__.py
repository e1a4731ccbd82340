"""bert-serve's TorchServe handler: decoding -> inference -> pipeline, wired by bert_handler."""
