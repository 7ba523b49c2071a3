"""Shared table and plot helpers of the grid examples."""
from fl_algorithms.experiments.tables import plot_mean_curves, pyplot


def test_mean_curves_keep_each_methods_colour_when_another_method_has_no_rows():
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2)
    rows = [{"method": m, "curve": [0.1, 0.2]} for m in ("a", "b", "c")]
    plot_mean_curves(left, rows, ("a", "b", "c"))
    plot_mean_curves(right, [r for r in rows if r["method"] != "b"], ("a", "b", "c"), first=lambda m: 3)
    colours = {(ax_name, line.get_label()): line.get_color()
               for ax_name, ax in (("left", left), ("right", right)) for line in ax.get_lines()}
    assert len(colours) == 5
    assert colours["left", "c"] == colours["right", "c"] != colours["left", "b"]
    assert list(right.get_lines()[0].get_xdata()) == [3, 4]
    assert list(left.get_lines()[0].get_ydata()) == [10.0, 20.0]  # x 100
    plt.close(fig)
