"""The one Definitions object of the code location (loaded through workspace.yaml / pyproject)."""

import dagster as dg

from synthkd_assets.defs import assets
from synthkd_assets.defs.resources import SynthKDPaths

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([assets]),
    resources={"paths": SynthKDPaths()},
)
