"""Every asset and standalone asset check of the code location, listed once: the Definitions and the
in-process build (defs/build.py) both take them from here."""

import dagster as dg

from synthkd_assets.defs import assets, ingest, manifests, near_dup, pool, valuation
from synthkd_assets.defs.checks import STANDALONE_CHECKS

ASSETS = [*dg.load_assets_from_modules([ingest, assets, near_dup, manifests, pool, valuation]), ingest.synth_raw]
ASSET_CHECKS = STANDALONE_CHECKS
