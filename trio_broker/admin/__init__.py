"""Admin CLI: a blocking client on our codec and ``trio-broker topics|groups|produce|consume``."""
