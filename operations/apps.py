from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    verbose_name = "Operations: plugin configuration, kill switches, uploads, schedules, software inventory"

    def ready(self):
        from fleet.gates import DISPATCH_GATES  # deferred: the app registry must be ready first

        from . import plugins, receivers  # noqa: F401  # deferred: models and signal receivers load once apps are ready
        if plugins.dispatch_gate not in DISPATCH_GATES:
            DISPATCH_GATES.append(plugins.dispatch_gate)
