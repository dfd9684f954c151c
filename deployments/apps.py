from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"

    def ready(self):
        from deployments import checks  # noqa: F401 - registers the stored plan versions' check
