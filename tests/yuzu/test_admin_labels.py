"""The admin's index names each model in the plural: Django's default adds an "s", which for a name already
ending in "s" gives "Agent exec statuss" (as a fresh install showed). Every registered model says its plural."""

from django.contrib import admin


def test_no_model_in_the_admin_is_named_with_a_doubled_s():
    bad = sorted(f"{m._meta.label}: {m._meta.verbose_name_plural}" for m in admin.site._registry
                 if str(m._meta.verbose_name_plural).endswith("ss"))
    assert bad == []
