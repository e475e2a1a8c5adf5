"""Remember which JVM classes and static methods PySpark has already looked up.

PySpark reaches the JVM through Py4J, and Py4J resolves every name afresh, each
time a round trip: `sc._jvm.functions.col("x")` asks the JVM whether
`functions` is a class (a failed `Class.forName("functions")` scans all ~280
Spark jars, then again for each imported package until
`org.apache.spark.sql.functions` is found), then whether `col` is one of its
methods (Java copies all ~1,000 `Method` objects of the class to answer), and
only then calls it. PySpark does this for every `F.col`, every literal and
every list it hands over. A demo-sized analysis made ~2,600 such class lookups
and as many method lookups: ~8 % of the driver JVM's sampled CPU in a JFR
profile, and a third of the analysis's ~16,700 round trips (bench/RESULTS.md,
thirteenth session). The analysis's wall time did not move beyond the noise
of repeated runs (the JVM's CPU is spread over much else): this removes work,
not the bottleneck.

A class stays a class and a static method a method for the life of the JVM, so
the answer to each question is kept on the Python object that asked it, the
session's `JVMView` or the `JavaClass` it returned: the next lookup of the same
name is an attribute read with no round trip. Fields and instance members are
not cached (their values can change), nor are failures or packages. The
objects kept are Py4J's own, so calls through them behave exactly as before;
they die with the view when the session's JVM stops.
"""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass, JavaMember, JVMView


class _RememberingJavaClass(JavaClass):
    """A Py4J JavaClass that keeps the static methods and nested classes it resolves."""

    def __getattr__(self, name: str) -> Any:
        found = super().__getattr__(name)
        if isinstance(found, (JavaMember, JavaClass)):
            _remember(self, name, found)
        return found


class _RememberingJVMView(JVMView):
    """A Py4J JVMView that keeps the classes it resolves."""

    def __getattr__(self, name: str) -> Any:
        found = super().__getattr__(name)
        if isinstance(found, JavaClass):
            _remember(self, name, found)
        return found


def _remember(owner: object, name: str, found: Any) -> None:
    """Store `found` as `owner.name`, so Python finds it before calling __getattr__ again."""
    if type(found) is JavaClass:
        found.__class__ = _RememberingJavaClass
    owner.__dict__[name] = found


def remember_jvm_lookups(view: JVMView) -> JVMView:
    """Make `view` (a session's `sc._jvm`) keep the classes and static methods looked up through it.

    Idempotent; returns the view. Changes only this object's class, so other
    gateways in the process are untouched.
    """
    if type(view) is JVMView:
        view.__class__ = _RememberingJVMView
    return view
