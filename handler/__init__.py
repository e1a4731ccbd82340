"""bert-serve's TorchServe handler: protocol (decode) -> inference -> pipeline, wired by
bert_handler."""
