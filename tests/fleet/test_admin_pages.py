"""The superuser's fleet pages write through fleet.services, as REST and MCP do: on the group page what those refuse
(a cycle, a taken name, a scope expression that does not parse, members of a dynamic group, an edit of a group
changed since) is a form error with nothing written, and what they allow leaves their audit rows; tags are set and
deleted by the tag service; executions and responses are shown, not edited."""

import html

import pytest
from django.utils import timezone

from fleet.models import Agent, Execution, ManagementGroup, Response, Tag
from tests.support.browser import staff_client
from yuzu.models import AuditEvent, RoleAssignment

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(make_user):
    return staff_client(make_user, "root", superuser=True)


def form(group, **changes):
    """The change form's fields as the page posts them, with ``changes``."""
    data = {"name": group.name, "description": group.description, "parent": group.parent_id or "",
            "membership_type": group.membership_type, "scope_expression": group.scope_expression,
            "members": [a.pk for a in group.members.all()], "seen_updated_at": seen(group)}
    return {**data, **changes}


def seen(group):
    """The page's hidden field: when it showed the group (Django renders it naive, in the current time zone)."""
    return timezone.localtime(group.updated_at).replace(tzinfo=None).isoformat(" ")


def page_text(r):
    return html.unescape(r.content.decode())


def test_a_group_under_its_own_descendant_is_refused_on_the_page_and_nothing_changes(root):
    top = ManagementGroup.objects.create(name="top")
    mid = ManagementGroup.objects.create(name="mid", parent=top)
    leaf = ManagementGroup.objects.create(name="leaf", parent=mid)
    for under in (leaf, top):  # its grandchild, itself
        r = root.post(f"/admin/fleet/managementgroup/{top.pk}/change/", form(top, parent=under.pk))
        assert r.status_code == 200 and "a group cannot be its own ancestor" in page_text(r)
        top.refresh_from_db()
        assert top.parent_id is None
    assert not AuditEvent.objects.filter(action__startswith="management_group.").exists()
    assert not AuditEvent.objects.filter(action__startswith="admin.managementgroup").exists()


def test_a_rename_to_a_taken_name_is_refused_and_a_rename_leaves_the_services_audit_row(root):
    ManagementGroup.objects.create(name="web")
    db = ManagementGroup.objects.create(name="db")
    r = root.post(f"/admin/fleet/managementgroup/{db.pk}/change/", form(db, name="web"))
    assert r.status_code == 200 and "a group named 'web' already exists" in page_text(r)
    db.refresh_from_db()
    assert db.name == "db"
    r = root.post(f"/admin/fleet/managementgroup/{db.pk}/change/", form(db, name="database"))
    assert r.status_code == 302
    db.refresh_from_db()
    assert db.name == "database"
    row = AuditEvent.objects.get(action="management_group.update")
    assert (row.principal, row.target_id, row.detail) == ("root", db.pk, "name")


def test_an_edit_of_a_group_changed_since_the_page_showed_it_is_refused(root):
    """The page posts every field; Django compares them with the row as it is now. Someone renamed the group after
    this page showed it: saving the page's description would have put the old name back."""
    group = ManagementGroup.objects.create(name="web")
    page = page_text(root.get(f"/admin/fleet/managementgroup/{group.pk}/change/"))
    assert f'name="seen_updated_at" value="{seen(group)}"' in page
    shown = form(group, description="the web tier")
    ManagementGroup.objects.filter(pk=group.pk).update(name="www", updated_at=timezone.now())  # REST, meanwhile
    r = root.post(f"/admin/fleet/managementgroup/{group.pk}/change/", shown)
    assert r.status_code == 200 and "was changed after your edit started; nothing was saved" in page_text(r)
    group.refresh_from_db()
    assert (group.name, group.description) == ("www", "")
    r = root.post(f"/admin/fleet/managementgroup/{group.pk}/change/", form(group, description="the web tier"))
    assert r.status_code == 302
    group.refresh_from_db()
    assert (group.name, group.description) == ("www", "the web tier")


def test_a_group_is_created_through_the_service_which_checks_its_scope_expression(root):
    new = {"name": "linux", "description": "", "parent": "", "membership_type": "dynamic", "members": []}
    r = root.post("/admin/fleet/managementgroup/add/", {**new, "scope_expression": "ostype ==="})
    assert r.status_code == 200 and "unexpected character '='" in page_text(r)
    assert not ManagementGroup.objects.exists()
    r = root.post("/admin/fleet/managementgroup/add/", {**new, "scope_expression": "ostype == linux"})
    assert r.status_code == 302
    group = ManagementGroup.objects.get()
    assert group.created_by == "root"
    assert AuditEvent.objects.filter(action="management_group.create", target_id=group.pk).count() == 1


def test_members_are_added_and_removed_through_the_service_and_a_dynamic_group_takes_none(root):
    a1, a2 = (Agent.objects.create(agent_id=i, hostname=f"{i}.example") for i in ("a1", "a2"))
    static = ManagementGroup.objects.create(name="static")
    static.members.add(a1)
    r = root.post(f"/admin/fleet/managementgroup/{static.pk}/change/", form(static, members=[a2.pk]))
    assert r.status_code == 302
    assert list(static.members.values_list("pk", flat=True)) == ["a2"]
    assert AuditEvent.objects.filter(action="management_group.add_member", detail="agent_id=a2").exists()
    assert AuditEvent.objects.filter(action="management_group.remove_member", detail="agent_id=a1").exists()

    dynamic = ManagementGroup.objects.create(name="dyn", membership_type="dynamic", scope_expression="ostype == linux")
    r = root.post(f"/admin/fleet/managementgroup/{dynamic.pk}/change/", form(dynamic, members=[a1.pk]))
    assert r.status_code == 200 and "a dynamic group's members come from its scope expression" in page_text(r)
    assert not dynamic.members.exists()


def test_a_refusal_after_a_write_undoes_the_write(root):
    """One form, several service calls: the rename went through, then adding a member to the (dynamic) group was
    refused — the rename and its audit row are undone with it."""
    agent = Agent.objects.create(agent_id="a1")
    dynamic = ManagementGroup.objects.create(name="dyn", membership_type="dynamic", scope_expression="ostype == linux")
    r = root.post(f"/admin/fleet/managementgroup/{dynamic.pk}/change/", form(dynamic, name="renamed",
                                                                                 members=[agent.pk]))
    assert r.status_code == 200 and "a dynamic group's members" in page_text(r)
    dynamic.refresh_from_db()
    assert dynamic.name == "dyn"
    assert not AuditEvent.objects.filter(action="management_group.update").exists()


def test_deleting_groups_goes_through_the_service_one_by_one(root, make_user):
    parent = ManagementGroup.objects.create(name="parent")
    child = ManagementGroup.objects.create(name="child", parent=parent)
    other = ManagementGroup.objects.create(name="other")
    make_user("owner", "ITServiceOwner", group=parent)
    r = root.post("/admin/fleet/managementgroup/", {"action": "delete_selected", "post": "yes",
                                                    "_selected_action": [parent.pk, other.pk]})
    assert r.status_code == 302
    assert list(ManagementGroup.objects.values_list("name", "parent")) == [("child", None)]
    assert not RoleAssignment.objects.filter(user__username="owner").exists()
    rows = AuditEvent.objects.filter(action="management_group.delete", principal="root")
    assert sorted(rows.values_list("target_id", "detail")) == sorted(
        [(parent.pk, "name=parent children_now_top_level=child"), (other.pk, "name=other")])
    r = root.post(f"/admin/fleet/managementgroup/{child.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302 and not ManagementGroup.objects.exists()
    assert AuditEvent.objects.filter(action="management_group.delete", target_id=child.pk).count() == 1


# --- tags and records: the rest of the fleet pages ---------------------------------------------------

def test_a_tag_is_set_and_deleted_on_its_page_through_the_service(root):
    """Set on the page with Django's save(), a tag was never sent to its agent and left the admin's audit row, not
    the service's (tag.set, as REST and MCP write it)."""
    Agent.objects.create(agent_id="a1", hostname="a1.example")
    r = root.post("/admin/fleet/tag/add/", {"agent": "a1", "key": "bad key!", "value": "x"})
    assert r.status_code == 200 and "tag key must be 1-64 characters" in page_text(r)
    assert not Tag.objects.exists()
    r = root.post("/admin/fleet/tag/add/", {"agent": "a1", "key": "Service", "value": " Web "})
    assert r.status_code == 302
    tag = Tag.objects.get()
    assert (tag.key, tag.value) == ("service", "web")
    assert AuditEvent.objects.filter(action="tag.set", target_id="a1", detail="service=web").exists()
    r = root.post(f"/admin/fleet/tag/{tag.pk}/change/", {"value": "Db"})
    assert r.status_code == 302
    assert Tag.objects.get().value == "db"
    r = root.post(f"/admin/fleet/tag/{tag.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302 and not Tag.objects.exists()
    assert AuditEvent.objects.filter(action="tag.delete", target_id="a1", detail="key=service deleted=True").exists()


def test_the_tag_pages_show_each_tags_origin_and_a_tag_changed_there_becomes_the_servers(root):
    """A reported tag changed on its page is the server's from then on (a register no longer changes it); the list
    and the agent's page say which tags are whose."""
    agent = Agent.objects.create(agent_id="a1", hostname="a1.example")
    reported = Tag.objects.create(agent=agent, key="role", value="web", origin=Tag.Origin.AGENT)
    Tag.objects.create(agent=agent, key="owner", value="ops", origin=Tag.Origin.AGENT)
    r = root.post(f"/admin/fleet/tag/{reported.pk}/change/", {"value": "db"})
    assert r.status_code == 302
    assert dict(Tag.objects.values_list("key", "origin")) == {"role": "server", "owner": "agent"}
    listing = page_text(root.get("/admin/fleet/tag/"))
    assert "Origin" in listing and "server" in listing and "agent" in listing
    assert "Origin" in page_text(root.get("/admin/fleet/agent/a1/change/"))


def test_executions_and_responses_are_shown_not_edited_and_an_agent_can_still_be_deleted(root):
    agent = Agent.objects.create(agent_id="a1", hostname="a1.example")
    Tag.objects.create(agent=agent, key="env", value="prod")
    execution = Execution.objects.create(plugin="system", action="uptime", command_id="c1", dispatched_by="op")
    Response.objects.create(execution=execution, instruction_id="c1", agent_id="a1", status="success")
    assert root.get(f"/admin/fleet/execution/{execution.pk}/change/").status_code == 200
    r = root.post(f"/admin/fleet/execution/{execution.pk}/change/", {"status": "failed", "dispatched_by": "nobody"})
    assert r.status_code == 403
    assert root.get("/admin/fleet/response/add/").status_code == 403
    assert Execution.objects.get().dispatched_by == "op"
    page = page_text(root.get("/admin/fleet/agent/a1/change/"))
    assert "prod" in page and 'name="tags-0-value"' not in page  # the agent's tags: shown, set on the Tags page
    r = root.post("/admin/fleet/agent/a1/delete/", {"post": "yes"})
    assert r.status_code == 302 and not Agent.objects.exists()


def test_what_an_agent_reports_is_shown_not_edited_and_its_quarantine_flag_still_is(root):
    """Scope expressions match an agent's reported OS: changed on its page, it moved the agent into or out of
    dynamic groups — and so under or out of the roles held on them — until the agent next said otherwise."""
    Agent.objects.create(agent_id="a1", hostname="a1.example", os="linux", quarantined=True)
    assert root.get("/admin/fleet/agent/add/").status_code == 403  # agents are enrolled
    r = root.post("/admin/fleet/agent/a1/change/", {"os": "windows", "hostname": "dc1", "quarantine_reason": "",
                                                    "tags-TOTAL_FORMS": "0", "tags-INITIAL_FORMS": "0"})
    assert r.status_code == 302
    agent = Agent.objects.get()
    assert (agent.os, agent.hostname, agent.quarantined) == ("linux", "a1.example", False)
