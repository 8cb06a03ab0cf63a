"""What a TPU costs per hour, where that is known offline: a small dated table of list prices.

Source: https://cloud.google.com/tpu/pricing, on-demand list price per chip-hour in us-central1
(us-central2 for v4, where v4 is offered), as listed there on PRICES_DATE. Prices differ by region,
change over time, and spot / preemptible / reserved / committed-use prices are not in the table:
for those, and for any type whose generation is missing, `hourly` answers None and `up` says
"price unknown". The figure is a guide, not a bill.
"""

from __future__ import annotations

from typing import Optional

PRICES_DATE = "2025-01"
PRICES_SOURCE = "https://cloud.google.com/tpu/pricing"
PRICES_REGIONS = ("us-central1", "us-central2")
# generation prefix -> USD per chip-hour, on demand
ON_DEMAND_PER_CHIP_HOUR = {
    "v2": 1.125,  # v2-8: 4 chips, $4.50/hour
    "v3": 2.00,  # v3-8: 4 chips, $8.00/hour
    "v4": 3.22,
    "v5litepod": 1.20,
    "v5p": 4.20,
    "v6e": 2.70,
}


def hourly(accelerator_type: str, zone: Optional[str], tier: str) -> Optional[float]:
    """USD per hour for the whole slice, or None when this table does not know it."""
    from tpulaunch.tpu.types import lookup

    found = lookup(accelerator_type)
    if found is None or tier != "on-demand":
        return None
    if zone and not zone.startswith(PRICES_REGIONS):
        return None
    per_chip = ON_DEMAND_PER_CHIP_HOUR.get(found.generation.prefix)
    return None if per_chip is None else round(per_chip * found.chips, 2)


def price_text(accelerator_type: str, zone: Optional[str], tier: str) -> str:
    """'about $8.00/hour (on-demand list price, us-central1, 2025-01, https://...)' or 'price unknown (...)'."""
    price = hourly(accelerator_type, zone, tier)
    if price is None:
        why = (f"{tier} prices are not in tpulaunch's table" if tier != "on-demand"
               else f"no list price for {accelerator_type} in {zone} in tpulaunch's table")
        return f"price unknown ({why}; see {PRICES_SOURCE})"
    region = zone.rsplit("-", 1)[0] if zone else "us-central1"
    return f"about ${price:,.2f}/hour (on-demand list price in {region}, {PRICES_DATE}, {PRICES_SOURCE})"
