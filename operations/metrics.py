"""The operator surface's metric families (docs/metrics.md)."""

from prometheus_client import Counter

PLUGIN_STORE_WRITES = Counter("yuzu_plugin_store_writes_total", "Plugin config/secret/kill-switch writes", ["kind"])
KILL_SWITCH_REFUSALS = Counter("yuzu_plugin_kill_switch_refusals_total", "Dispatches refused by a kill switch")
SOFTWARE_SYNCS = Counter("yuzu_software_inventory_syncs_total", "Software inventory reports by outcome",
                         ["source", "outcome"])
UPLOAD_EVENTS = Counter("yuzu_upload_events_total", "Upload grant and session events", ["event"])
UPLOAD_BYTES = Counter("yuzu_upload_bytes_total", "Bytes received by upload sessions")
SCHEDULE_FIRES = Counter("yuzu_schedule_fires_total", "Instruction schedule evaluations by outcome", ["outcome"])
