"""Assembly only: each published architecture built from :mod:`gpt2k3.layers` on the one decoder
:class:`gpt2k3.model.GPT`, one file per architecture."""
