"""The book's experiments: associative memory, forgetting, the MQAR recall task, the King James
Bible corpus, byte-level language models, and the one training loop they share. The core
(``model``, ``layers``, ``ops``, ``cache``) never imports this package."""
