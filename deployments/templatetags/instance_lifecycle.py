"""The upgrade, roll back and deletion protection controls of the instance page."""

from django import template

from accounts import roles
from deployments import selectors

register = template.Library()


@register.simple_tag(takes_context=True)
def lifecycle_offer(context, instance) -> selectors.LifecycleOffer:
    """What the member viewing the page may do of upgrade, roll back and protection, now."""
    role = context["request"].membership.role
    return selectors.instance_lifecycle_offer(instance, roles.allowed_actions(role))
