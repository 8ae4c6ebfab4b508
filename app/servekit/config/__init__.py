"""Configuration: serve.yaml's schema, its loading with line numbers, command-line overrides,
and the compiler that turns it into the frozen plan a server runs (versions found on disk,
runtimes chosen, tokens and TLS files read). The bottom layer beside types and errors: it
imports nothing that serves requests."""
