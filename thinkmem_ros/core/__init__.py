"""What every side shares and that depends on nothing else in the project.

The thinking vocabulary, the labelled situation containers, the scoring metrics and the
package's data paths. Robot, link, policy and offboard code all import from here; this
package imports nothing from them.
"""
